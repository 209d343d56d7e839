"""Prefix caching: full blocks are shared by identical prefixes, never more than that."""

from __future__ import annotations

from block_views import BLOCK_SIZE, NUM_BLOCKS, cached_ids, ref_counts, tokens

from pagedserve.services.block_manager.manager import BlockManager


def test_two_requests_sharing_a_three_block_prefix_share_exactly_those_blocks(manager: BlockManager) -> None:
    prefix = tokens(3 * BLOCK_SIZE)
    a = manager.allocate("w0", "a", "s", prefix + [100, 101, 102, 103, 104], 100, 0.0)
    b = manager.allocate("w0", "b", "s", prefix + [200, 201, 202, 203, 204], 100, 0.0)
    assert a is not None and b is not None
    assert b.block_ids[:3] == a.block_ids[:3]
    assert b.block_ids[3] != a.block_ids[3]
    assert b.num_cached_tokens == 3 * BLOCK_SIZE
    assert b.num_new_tokens == 5
    refs = ref_counts(manager)
    assert [refs[i] for i in a.block_ids[:3]] == [2, 2, 2]
    assert refs[a.block_ids[3]] == 1 and refs[b.block_ids[3]] == 1


def test_partially_filled_block_is_never_cached(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(BLOCK_SIZE + 2), 100, 0.0)
    assert a is not None
    assert cached_ids(manager) == {a.block_ids[0]}
    b = manager.allocate("w0", "b", "s", tokens(BLOCK_SIZE + 3), 100, 0.0)
    assert b is not None
    assert b.num_cached_tokens == BLOCK_SIZE  # the first block only; the partial one is not shared
    assert b.block_ids[1] != a.block_ids[1]


def test_whole_prompt_hit_still_leaves_one_token_to_compute(manager: BlockManager) -> None:
    prompt = tokens(2 * BLOCK_SIZE)
    assert manager.allocate("w0", "a", "s", prompt, 100, 0.0) is not None
    b = manager.allocate("w0", "b", "s", prompt, 100, 0.0)
    assert b is not None
    # The second block would cover the last token, which must be computed to give logits.
    assert b.num_cached_tokens == BLOCK_SIZE
    assert b.num_new_tokens == BLOCK_SIZE


def test_prompt_one_token_past_cached_blocks_hits_them_all(manager: BlockManager) -> None:
    assert manager.allocate("w0", "a", "s", tokens(2 * BLOCK_SIZE), 100, 0.0) is not None
    b = manager.allocate("w0", "b", "s", tokens(2 * BLOCK_SIZE + 1), 100, 0.0)
    assert b is not None and b.num_cached_tokens == 2 * BLOCK_SIZE and b.num_new_tokens == 1


def test_cached_free_block_is_reused_by_prefix_hit(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(2 * BLOCK_SIZE + 1), 100, 0.0)
    assert a is not None
    manager.free("a")
    assert manager.num_free_blocks("w0") == NUM_BLOCKS
    b = manager.allocate("w0", "b", "s", tokens(2 * BLOCK_SIZE + 1), 100, 1.0)
    assert b is not None
    assert b.block_ids[:2] == a.block_ids[:2] and b.num_cached_tokens == 2 * BLOCK_SIZE
    assert manager.num_free_blocks("w0") == NUM_BLOCKS - 3


def test_hit_requires_the_same_prefix_not_just_the_same_block(manager: BlockManager) -> None:
    shared_tail = [7] * BLOCK_SIZE
    assert manager.allocate("w0", "a", "s", [1] * BLOCK_SIZE + shared_tail + [0], 100, 0.0) is not None
    b = manager.allocate("w0", "b", "s", [2] * BLOCK_SIZE + shared_tail + [0], 100, 0.0)
    assert b is not None and b.num_cached_tokens == 0


def test_reusing_a_cached_free_block_evicts_its_hash() -> None:
    m = BlockManager()
    m.add_pool("w0", 4, BLOCK_SIZE)
    old = m.allocate("w0", "old", "s", tokens(BLOCK_SIZE + 1), 100, 0.0)
    new = m.allocate("w0", "new", "s", tokens(BLOCK_SIZE + 1, start=50), 100, 0.0)
    assert old is not None and new is not None
    m.free("old")  # freed first: the least recently freed, so its blocks are handed out first
    m.free("new")
    assert cached_ids(m) == {old.block_ids[0], new.block_ids[0]}
    taker = m.allocate("w0", "taker", "s", [9] * (BLOCK_SIZE + 1), 100, 1.0)
    assert taker is not None and set(taker.block_ids) == set(old.block_ids)
    # old's cached head now holds taker's tokens: its old hash is gone, new's survives.
    assert cached_ids(m) == {taker.block_ids[0], new.block_ids[0]}
    again_new = m.allocate("w0", "again-new", "s", tokens(BLOCK_SIZE + 1, start=50), 100, 2.0)
    assert again_new is not None and again_new.num_cached_tokens == BLOCK_SIZE
    m.free("again-new")
    again_old = m.allocate("w0", "again-old", "s", tokens(BLOCK_SIZE + 1), 100, 2.0)
    assert again_old is not None and again_old.num_cached_tokens == 0
    assert m.check_invariants() == []


def test_free_list_hands_out_the_least_recently_freed_block_first() -> None:
    m = BlockManager(enable_prefix_caching=False)
    m.add_pool("w0", 3, BLOCK_SIZE)
    ids = {}
    for rid in ("a", "b", "c"):
        alloc = m.allocate("w0", rid, "s", [1], 1, 0.0)
        assert alloc is not None
        ids[rid] = alloc.block_ids[0]
    for rid in ("b", "c", "a"):
        m.free(rid)
    got = []
    for rid in ("x", "y", "z"):
        alloc = m.allocate("w0", rid, "s", [1], 1, 1.0)
        assert alloc is not None
        got.append(alloc.block_ids[0])
    assert got == [ids["b"], ids["c"], ids["a"]]


def test_disabled_prefix_caching_hashes_nothing() -> None:
    m = BlockManager(enable_prefix_caching=False)
    m.add_pool("w0", NUM_BLOCKS, BLOCK_SIZE)
    assert m.allocate("w0", "a", "s", tokens(3 * BLOCK_SIZE), 100, 0.0) is not None
    b = m.allocate("w0", "b", "s", tokens(3 * BLOCK_SIZE), 100, 0.0)
    assert b is not None and b.num_cached_tokens == 0
    assert cached_ids(m) == set()
    assert m.snapshot(0.0)["totals"]["cached"] == 0


def test_prefix_cache_is_per_pool(manager: BlockManager) -> None:
    manager.add_pool("w1", NUM_BLOCKS, BLOCK_SIZE)
    assert manager.allocate("w0", "a", "s", tokens(2 * BLOCK_SIZE + 1), 100, 0.0) is not None
    b = manager.allocate("w1", "b", "s", tokens(2 * BLOCK_SIZE + 1), 100, 0.0)
    assert b is not None and b.num_cached_tokens == 0


def test_chunked_prefill_caches_blocks_only_once_their_slots_are_given(manager: BlockManager) -> None:
    prompt = tokens(3 * BLOCK_SIZE + 1)
    a = manager.allocate("w0", "a", "s", prompt, BLOCK_SIZE + 2, 0.0)  # a first chunk of 6 tokens
    assert a is not None and a.num_new_tokens == BLOCK_SIZE + 2 and len(a.block_ids) == 2
    assert cached_ids(manager) == {a.block_ids[0]}
    growth = manager.grow("a", 2 * BLOCK_SIZE - 1, [], 1.0)  # the rest of the prompt
    assert growth is not None and len(growth.new_block_ids) == 2
    table = manager.table("a")
    assert table is not None and cached_ids(manager) == set(table[:3])


def test_decode_ahead_caches_a_block_once_its_last_token_is_known(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(BLOCK_SIZE - 1), 100, 0.0)
    assert a is not None
    # The slot of the block's last position is handed out before its token is sampled.
    growth = manager.grow("a", 1, [], 1.0)
    assert growth is not None and cached_ids(manager) == set()
    manager.grow("a", 1, [42], 2.0)  # the sampled token arrives with the next step
    assert cached_ids(manager) == {a.block_ids[0]}
    b = manager.allocate("w0", "b", "s", tokens(BLOCK_SIZE - 1) + [42, 5], 100, 3.0)
    assert b is not None and b.block_ids[0] == a.block_ids[0]


def test_identical_content_computed_twice_is_cached_once_and_the_chain_goes_on(manager: BlockManager) -> None:
    prompt = tokens(2 * BLOCK_SIZE)
    a = manager.allocate("w0", "a", "s", prompt[:3], 3, 0.0)  # a and b both compute the prompt in chunks
    b = manager.allocate("w0", "b", "s", prompt[:3], 3, 0.0)
    assert a is not None and b is not None and a.block_ids[0] != b.block_ids[0]
    manager.grow("a", 2 * BLOCK_SIZE - 3, prompt[3:], 1.0)
    manager.grow("b", 2 * BLOCK_SIZE - 3, prompt[3:], 1.0)
    assert len(cached_ids(manager)) == 2  # a's blocks; b's copies add nothing
    manager.free("a")
    # b's second block could not be cached (a's was), but the chain was followed through a's.
    c = manager.allocate("w0", "c", "s", prompt + [1], 100, 2.0)
    table_a_blocks = set(cached_ids(manager))
    assert c is not None and c.num_cached_tokens == 2 * BLOCK_SIZE
    assert set(c.block_ids[:2]) == table_a_blocks


def test_a_cache_namespace_keeps_its_own_chains(manager: BlockManager) -> None:
    """The same tokens under another salt are other KV (a LongRoPE request past its original length):
    no hit across salts in either direction, hits within one."""
    prompt = tokens(2 * BLOCK_SIZE + 1)
    plain = manager.allocate("w0", "plain", "s", prompt, 100, 0.0)
    salted = manager.allocate("w0", "salted", "s", prompt, 100, 0.0, cache_namespace="longrope")
    assert plain is not None and salted is not None
    assert salted.num_cached_tokens == 0 and not set(salted.block_ids) & set(plain.block_ids)
    again = manager.allocate("w0", "salted-again", "s", prompt, 100, 0.0, cache_namespace="longrope")
    plain_again = manager.allocate("w0", "plain-again", "s", prompt, 100, 0.0)
    assert again is not None and plain_again is not None
    assert again.num_cached_tokens == 2 * BLOCK_SIZE and again.block_ids[:2] == salted.block_ids[:2]
    assert (
        plain_again.num_cached_tokens == 2 * BLOCK_SIZE and plain_again.block_ids[:2] == plain.block_ids[:2]
    )
    assert manager.check_invariants() == []
