"""Leases: blocks of a request nobody renews go back to the free list."""

from __future__ import annotations

from block_views import NUM_BLOCKS, TTL, tokens

from pagedserve.services.block_manager.leases import LeaseTable
from pagedserve.services.block_manager.manager import BlockManager, Reclaimed


def test_expired_lease_returns_blocks_to_free_list(manager: BlockManager) -> None:
    manager.allocate("w0", "a", "crashed", tokens(9), 100, 0.0)
    assert manager.reap_expired(TTL - 0.1) == []
    reclaimed = manager.reap_expired(TTL)
    assert reclaimed == [Reclaimed("a", "crashed", "w0", 3)]
    assert manager.table("a") is None
    assert manager.num_free_blocks("w0") == NUM_BLOCKS


def test_renewed_lease_is_not_reaped(manager: BlockManager) -> None:
    manager.allocate("w0", "a", "s", [1], 1, 0.0)
    assert manager.renew_owner("s", TTL - 1.0) == 1
    assert manager.reap_expired(TTL + 1.0) == []
    assert [r.request_id for r in manager.reap_expired(2 * TTL)] == ["a"]


def test_any_op_on_a_request_renews_its_lease(manager: BlockManager) -> None:
    manager.allocate("w0", "a", "s", [1], 1, 0.0)
    manager.allocate("w0", "b", "s", [1], 1, 0.0)
    manager.grow("a", 1, [], 5.0)
    manager.fork("b", "b.1", "s", 6.0)
    assert manager.reap_expired(TTL + 1.0) == []
    assert {r.request_id for r in manager.reap_expired(TTL + 6.0)} == {"a", "b", "b.1"}


def test_renewing_an_owner_renews_only_its_leases(manager: BlockManager) -> None:
    manager.allocate("w0", "mine", "scheduler-1", [1], 1, 0.0)
    manager.allocate("w0", "theirs", "scheduler-2", [1], 1, 0.0)
    assert manager.renew_owner("scheduler-1", 5.0) == 1
    assert [r.request_id for r in manager.reap_expired(TTL + 1.0)] == ["theirs"]


def test_reaping_a_forked_child_keeps_the_shared_blocks_of_its_parent(manager: BlockManager) -> None:
    manager.allocate("w0", "a", "s", tokens(6), 100, 0.0)
    manager.fork("a", "a.1", "other", 0.0)
    manager.renew_owner("s", 5.0)
    assert manager.reap_expired(TTL + 1.0) == [Reclaimed("a.1", "other", "w0", 0)]
    assert manager.table("a") is not None and manager.check_invariants() == []


def test_removing_a_pool_drops_its_leases(manager: BlockManager) -> None:
    manager.add_pool("w1", NUM_BLOCKS, 4)
    manager.allocate("w0", "a", "s", [1], 1, 0.0)
    manager.allocate("w1", "b", "s", [1], 1, 0.0)
    assert manager.remove_pool("w1") == ["b"]
    assert not manager.has_pool("w1")
    assert [lease["request_id"] for lease in manager.snapshot(0.0)["leases"]] == ["a"]
    assert [r.request_id for r in manager.reap_expired(TTL)] == ["a"]
    assert manager.remove_pool("w1") == []


def test_lease_table_lists_expired_leases_soonest_first() -> None:
    leases = LeaseTable(ttl_s=10.0)
    leases.grant("s", "late", 3.0)
    leases.grant("s", "early", 1.0)
    leases.grant("s", "alive", 9.0)
    assert [lease.request_id for lease in leases.expired(15.0)] == ["early", "late"]
