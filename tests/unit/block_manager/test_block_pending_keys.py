"""Pending prefix-cache keys: a block keyed before its KV is written serves hits only to the owner
whose step writes it, until that owner frees the table with the slots computed. Tables of a
vanished owner (reaped) or freed with slots not computed take their keys out of the cache."""

from __future__ import annotations

import msgspec
from block_views import BLOCK_SIZE, TTL, cached_ids, tokens

from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.shared.protocol.blocks import Freed, OpError, read_batch

PROMPT = tokens(2 * BLOCK_SIZE + 1)  # two full blocks, then one token


def pending(manager: BlockManager) -> dict[int, str]:
    pool = manager.snapshot(0.0)["pools"][0]
    return {b["id"]: b["pending_owner"] for b in pool["blocks"] if b["pending_owner"] is not None}


def test_a_pending_block_is_a_hit_for_its_owner_only(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "old", PROMPT, 100, 0.0)
    assert a is not None and pending(manager) == {a.block_ids[0]: "old", a.block_ids[1]: "old"}
    same_owner = manager.allocate("w0", "b", "old", PROMPT, 100, 0.0)
    other_owner = manager.allocate("w0", "c", "new", PROMPT, 100, 0.0)
    assert same_owner is not None and same_owner.num_cached_tokens == 2 * BLOCK_SIZE
    assert other_owner is not None and other_owner.num_cached_tokens == 0
    assert manager.check_invariants() == []


def test_free_with_every_slot_computed_confirms_the_keys_for_everyone(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "old", PROMPT, 100, 0.0)
    assert a is not None
    manager.free("a", num_computed=len(PROMPT))
    assert pending(manager) == {}
    b = manager.allocate("w0", "b", "new", PROMPT, 100, 1.0)
    assert b is not None and b.num_cached_tokens == 2 * BLOCK_SIZE
    assert b.block_ids[:2] == a.block_ids[:2]


def test_free_with_slots_not_computed_drops_their_keys(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "old", PROMPT, 100, 0.0)
    assert a is not None
    manager.free("a", num_computed=BLOCK_SIZE + 1)  # the second block's KV was never all written
    assert cached_ids(manager) == {a.block_ids[0]}
    b = manager.allocate("w0", "b", "old", PROMPT, 100, 1.0)
    assert b is not None and b.num_cached_tokens == BLOCK_SIZE
    assert manager.check_invariants() == []


def test_a_reaped_table_takes_its_pending_keys_out_of_the_cache(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "vanished", PROMPT, 100, 0.0)
    assert a is not None
    reclaimed = manager.reap_expired(TTL + 1)
    assert [r.request_id for r in reclaimed] == ["a"]
    assert cached_ids(manager) == set() and pending(manager) == {}
    b = manager.allocate("w0", "b", "vanished", PROMPT, 100, TTL + 1)
    assert b is not None and b.num_cached_tokens == 0


def test_the_same_content_written_by_another_owner_takes_the_key_over(manager: BlockManager) -> None:
    ghost = manager.allocate("w0", "ghost", "old", PROMPT, 100, 0.0)
    real = manager.allocate("w0", "real", "new", PROMPT, 100, 0.0)
    assert ghost is not None and real is not None and real.num_cached_tokens == 0
    assert pending(manager) == {real.block_ids[0]: "new", real.block_ids[1]: "new"}
    manager.free("real", num_computed=len(PROMPT))
    manager.reap_expired(TTL + 1)  # the ghost goes; the content the real owner wrote stays cached
    later = manager.allocate("w0", "later", "newer", PROMPT, 100, TTL + 1)
    assert later is not None and later.num_cached_tokens == 2 * BLOCK_SIZE
    assert later.block_ids[:2] == real.block_ids[:2]
    assert manager.check_invariants() == []


def test_a_free_op_names_a_bad_num_computed(manager: BlockManager) -> None:
    assert manager.allocate("w0", "a", "s", PROMPT, 100, 0.0) is not None
    batch = read_batch(
        msgspec.msgpack.encode(
            {"seq": 1, "ops": [["free", "a", -1], ["free", "a", "all"], ["free", "a", None]]}
        )
    )
    results = manager.apply(batch.ops, 0.0).results
    assert [type(r) for r in results] == [OpError, OpError, Freed]
    assert "$.ops[0][2]" in results[0].message and "$.ops[1][2]" in results[1].message  # num_computed
    assert results[2] == Freed(3) and manager.num_requests() == 0
