"""The live view's pool encoding: one state byte per block, and the invariants it checks itself."""

from __future__ import annotations

from block_views import BLOCK_SIZE, NUM_BLOCKS, TTL, tokens

from pagedserve.services.block_manager import pool_view as pv
from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.shared.ops_page import decode_states


def states(manager: BlockManager, now: float, pool_id: str = "w0") -> list[str]:
    view = manager.pool_view(now)
    pool = next(p for p in view["pools"] if p["worker_id"] == pool_id)
    return [view["states"][code] for code in decode_states(pool["states"])]


def test_a_fresh_pool_is_all_free_and_healthy(manager: BlockManager) -> None:
    view = manager.pool_view(0.0)
    assert states(manager, 0.0) == ["free"] * NUM_BLOCKS
    assert view["invariants"] == {"ok": True, "count": 0, "violations": []}
    assert view["by_state"]["free"] == NUM_BLOCKS


def test_held_pending_cached_and_shared_blocks_are_told_apart(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(2 * BLOCK_SIZE + 1), 100, 0.0)
    got = states(manager, 0.0)
    assert [got[b] for b in a.block_ids] == ["pending", "pending", "held"]  # keyed, not yet confirmed
    manager.free("a")  # every slot computed: the keys are confirmed, the blocks free with their prefix
    got = states(manager, 0.0)
    assert [got[b] for b in a.block_ids] == ["free_cached", "free_cached", "free"]
    b = manager.allocate("w0", "b", "s", tokens(2 * BLOCK_SIZE + 1), 100, 0.0)
    got = states(manager, 0.0)
    assert [got[x] for x in b.block_ids] == ["cached", "cached", "held"]
    manager.fork("b", "c", "s", 0.0)
    got = states(manager, 0.0)
    assert [got[x] for x in b.block_ids] == ["shared"] * 3


def test_a_lease_nobody_renews_shows_expiring_then_leaked(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "ghost", tokens(BLOCK_SIZE + 1), 100, 0.0)
    assert {states(manager, 1.0)[b] for b in a.block_ids} <= {"pending", "held"}
    assert {states(manager, TTL * 0.6)[b] for b in a.block_ids} == {"expiring"}
    view = manager.pool_view(TTL + 0.1)
    assert {states(manager, TTL + 0.1)[b] for b in a.block_ids} == {"leaked"}
    assert view["by_state"]["leaked"] == manager.snapshot(TTL + 0.1)["totals"]["leaked"] == 2
    assert view["invariants"]["ok"]  # a lapsed lease is the reaper's work, not a broken invariant
    manager.reap_expired(TTL + 0.1)
    assert states(manager, TTL + 0.2) == ["free"] * NUM_BLOCKS


def test_a_ref_count_the_tables_do_not_explain_is_broken_and_named(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(BLOCK_SIZE), 100, 0.0)
    manager._pools["w0"].blocks[a.block_ids[0]].ref_count = 2  # a bug's footprint, put there by hand
    view = manager.pool_view(0.0)
    assert states(manager, 0.0)[a.block_ids[0]] == "broken"
    assert not view["invariants"]["ok"]
    assert f"first: [{a.block_ids[0]}]" in view["invariants"]["violations"][0]
    assert manager.check_invariants()  # the full check agrees that something is wrong


def test_block_detail_names_owners_lease_and_age(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(2 * BLOCK_SIZE + 1), 100, 1.0)
    detail = manager.block_detail("w0", a.block_ids[0], 4.0)
    assert detail["ref_count"] == 1 and detail["pending_owner"] == "s" and detail["hash"]
    (owner,) = detail["owners"]
    assert owner["request_id"] == "a" and owner["lease_owner"] == "s"
    assert owner["held_for_s"] == 3.0 and owner["lease_expires_in_s"] == TTL - 3.0
    assert (
        manager.block_detail("w0", NUM_BLOCKS, 4.0) is None and manager.block_detail("nope", 0, 4.0) is None
    )
    assert manager.request_blocks("a") == {"request_id": "a", "worker_id": "w0", "block_ids": a.block_ids}


def test_states_are_listed_in_order_of_their_codes() -> None:
    assert [pv.STATES.index(name) for name in ("free", "leaked", "broken")] == [pv.FREE, pv.LEAKED, pv.BROKEN]
