"""The placement policy: shared prompt starts stay together, load imbalance overrides the cache, the
baselines do what they say, and what a shard has seen is bounded and forgotten when it is lost."""

from __future__ import annotations

from pagedserve.services.router.placement import Placement
from pagedserve.services.router.prefix_index import MAX_BLOCKS, SeenPrefixes, prompt_blocks

SYSTEM_A = "You are a careful assistant for the billing team. " * 40
SYSTEM_B = "You translate German legal text into plain English. " * 40


def alive(placement: Placement) -> Placement:
    for i in range(placement.num_shards):
        placement.set_alive(i, True)
    return placement


def place(placement: Placement, prompt: str, cost: int = 100) -> int:
    chosen = placement.choose(prompt_blocks(prompt, 16))
    assert chosen is not None
    placement.started(chosen[0], prompt_blocks(prompt, 16), cost)
    return chosen[0]


def test_blocks_chain_so_a_shared_start_shares_hashes_and_nothing_after_a_difference():
    a1 = prompt_blocks(SYSTEM_A + "question one", 16)
    a2 = prompt_blocks(SYSTEM_A + "another question entirely", 16)
    b = prompt_blocks(SYSTEM_B, 16)
    assert len(a1) == len(SYSTEM_A + "question one") // 64
    shared = len(SYSTEM_A) // 64
    assert a1[:shared] == a2[:shared]
    assert not set(a1) & set(b)
    assert prompt_blocks(list(range(40)), 16) == prompt_blocks(list(range(32)) + [7] * 8, 16)[:2]
    assert len(prompt_blocks("x" * 100_000, 16)) == MAX_BLOCKS


def test_cache_aware_keeps_each_system_prompt_on_the_shard_that_saw_it():
    p = alive(Placement(2, balance_abs=10**6))
    first_a = place(p, SYSTEM_A + "turn 0")
    first_b = place(p, SYSTEM_B + "turn 0")
    assert first_a != first_b  # the second goes to the lighter shard: nothing seen matches it
    for turn in range(1, 6):
        assert place(p, SYSTEM_A + f"turn {turn}") == first_a
        assert place(p, SYSTEM_B + f"turn {turn}") == first_b


def test_imbalance_beyond_both_thresholds_sends_the_request_to_the_least_loaded_shard():
    p = alive(Placement(2, balance_abs=1000, balance_rel=1.5))
    home = place(p, SYSTEM_A, cost=5000)
    chosen = p.choose(prompt_blocks(SYSTEM_A + "more", 16))
    assert chosen == (1 - home, "balance")
    p.started(1 - home, [], 4000)  # now 5000 vs 4000: far apart in tokens, but not by 1.5x
    assert p.choose(prompt_blocks(SYSTEM_A + "more", 16)) == (home, "cache")


def test_a_short_match_below_the_threshold_is_not_a_reason():
    p = alive(Placement(2, cache_threshold=0.9, balance_abs=10**6))
    home = place(p, SYSTEM_A, cost=50)
    other_prompt = SYSTEM_A[: len(SYSTEM_A) // 2] + SYSTEM_B
    assert p.choose(prompt_blocks(other_prompt, 16)) == (1 - home, "least_load")


def test_round_robin_and_least_load_ignore_the_prompt():
    rr = alive(Placement(3, policy="round_robin"))
    assert [place(rr, SYSTEM_A) for _ in range(6)] == [1, 2, 0, 1, 2, 0]
    ll = alive(Placement(2, policy="least_load"))
    ll.started(0, [], 10)
    assert ll.choose(prompt_blocks(SYSTEM_A, 16)) == (1, "least_load")


def test_only_live_shards_are_chosen_and_a_lost_one_forgets_what_it_saw():
    p = Placement(2)
    assert p.choose([1, 2]) is None
    alive(p)
    home = place(p, SYSTEM_A)
    p.set_alive(home, False)
    assert p.choose(prompt_blocks(SYSTEM_A, 16)) == (1 - home, "least_load")
    assert len(p.shards[home].seen) == 0
    p.ended(home, 10**9)  # never below zero
    assert p.shards[home].tokens == 0


def test_seen_prefixes_drop_the_least_recently_used_past_capacity():
    seen = SeenPrefixes(capacity=3)
    seen.add([1, 2, 3])
    seen.add([1])  # 1 is fresh again
    seen.add([4])
    assert seen.matched([1]) == 1 and seen.matched([2]) == 0 and len(seen) == 3
