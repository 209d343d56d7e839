"""The health dump (`GET /blocks`) and the invariants it reports."""

from __future__ import annotations

import json

from block_views import BLOCK_SIZE, NUM_BLOCKS, TTL, tokens

from pagedserve.services.block_manager.manager import BlockManager


def test_snapshot_totals_count_free_used_and_cached_blocks(manager: BlockManager) -> None:
    manager.allocate("w0", "a", "s", tokens(2 * BLOCK_SIZE + 1), 100, 0.0)
    manager.allocate("w0", "b", "s", tokens(2 * BLOCK_SIZE + 1), 100, 0.0)  # hits a's two full blocks
    manager.free("a")  # a's tail block becomes free; the shared two stay used
    totals = manager.snapshot(1.0)["totals"]
    assert totals == {"total": NUM_BLOCKS, "free": NUM_BLOCKS - 3, "used": 3, "cached": 2, "leaked": 0}


def test_snapshot_lists_each_block_with_owners_hash_and_lease(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(BLOCK_SIZE + 1), 100, 0.0)
    assert a is not None
    manager.fork("a", "a.1", "s", 2.0)
    snap = manager.snapshot(3.0)
    assert json.loads(json.dumps(snap)) == snap  # JSON-ready as is
    pool = snap["pools"][0]
    assert (pool["worker_id"], pool["num_blocks"], pool["block_size"]) == ("w0", NUM_BLOCKS, BLOCK_SIZE)
    head = pool["blocks"][a.block_ids[0]]
    assert head["ref_count"] == 2 and sorted(head["owners"]) == ["a", "a.1"]
    assert isinstance(head["hash"], str) and len(head["hash"]) == 16
    assert head["pending_owner"] == "s"  # keyed when given, before its owner saw it computed
    assert head["lease_expires_in_s"] == TTL - 1.0  # a's lease (renewed by the fork at 2.0) ends soonest
    assert pool["blocks"][a.block_ids[1]]["hash"] is None
    unused = next(b for b in pool["blocks"] if b["id"] not in a.block_ids)
    assert unused == {
        "id": unused["id"],
        "ref_count": 0,
        "owners": [],
        "hash": None,
        "pending_owner": None,
        "lease_expires_in_s": None,
    }
    assert {(lease["request_id"], lease["num_blocks"]) for lease in snap["leases"]} == {("a", 2), ("a.1", 2)}
    assert snap["invariants"] == {"ok": True, "violations": []}


def test_blocks_of_an_expired_unreaped_lease_count_as_leaked(manager: BlockManager) -> None:
    manager.allocate("w0", "a", "crashed", tokens(2 * BLOCK_SIZE), 100, 0.0)
    manager.allocate("w0", "b", "alive", [1], 1, 0.0)
    manager.renew_owner("alive", TTL)
    assert manager.snapshot(TTL - 1.0)["totals"]["leaked"] == 0
    assert manager.snapshot(TTL + 1.0)["totals"]["leaked"] == 2
    manager.reap_expired(TTL + 1.0)
    assert manager.snapshot(TTL + 1.0)["totals"]["leaked"] == 0


def test_shared_block_is_not_leaked_while_one_owner_lives(manager: BlockManager) -> None:
    manager.allocate("w0", "a", "s", tokens(BLOCK_SIZE), 100, 0.0)
    manager.fork("a", "a.1", "other", 0.0)
    manager.renew_owner("other", 5.0)
    assert manager.snapshot(TTL + 1.0)["totals"]["leaked"] == 0


def test_check_invariants_reports_a_corrupted_ref_count(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", [1], 1, 0.0)
    assert a is not None and manager.check_invariants() == []
    manager._pools["w0"].blocks[a.block_ids[0]].ref_count = 2  # simulate a bug
    violations = manager.check_invariants()
    assert any("ref_count 2 but 1 table entries" in v for v in violations)
    assert manager.snapshot(0.0)["invariants"]["ok"] is False


def test_check_invariants_reports_a_referenced_block_in_the_free_list(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", [1], 1, 0.0)
    assert a is not None
    pool = manager._pools["w0"]
    pool.free[a.block_ids[0]] = pool.blocks[a.block_ids[0]]  # simulate a double free
    violations = manager.check_invariants()
    assert any("in the free list with ref_count 1" in v for v in violations)
    assert any("free" in v and "!= total" in v for v in violations)
