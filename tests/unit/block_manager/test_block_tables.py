"""Block tables: allocate, grow, fork with copy-on-write, free."""

from __future__ import annotations

import pytest
from block_views import BLOCK_SIZE, NUM_BLOCKS, ref_counts, tokens

from pagedserve.services.block_manager.manager import (
    BlockManager,
    BlockManagerError,
    UnknownPoolError,
    UnknownRequestError,
)
from pagedserve.shared.protocol.blocks import UNCHANGED


def test_allocation_covers_the_prompt_with_fresh_blocks(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(2 * BLOCK_SIZE + 1), 100, 0.0)
    assert a is not None
    assert len(a.block_ids) == 3 and len(set(a.block_ids)) == 3
    assert (a.num_cached_tokens, a.num_new_tokens) == (0, 2 * BLOCK_SIZE + 1)
    assert manager.num_free_blocks("w0") == NUM_BLOCKS - 3


def test_allocation_of_a_first_chunk_covers_only_that_chunk(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(5 * BLOCK_SIZE), BLOCK_SIZE + 1, 0.0)
    assert a is not None and a.num_new_tokens == BLOCK_SIZE + 1 and len(a.block_ids) == 2


def test_failed_allocation_changes_nothing(manager: BlockManager) -> None:
    prefix = tokens(2 * BLOCK_SIZE)
    assert manager.allocate("w0", "a", "s", prefix + [1], 100, 0.0) is not None
    manager.free("a")  # the prefix stays cached in free blocks
    before = manager.snapshot(0.0)
    # Hits the two cached blocks, then needs more fresh blocks than there are.
    too_big = prefix + tokens(NUM_BLOCKS * BLOCK_SIZE, start=1000)
    assert manager.allocate("w0", "b", "s", too_big, len(too_big), 1.0) is None
    assert manager.snapshot(0.0) == before
    assert manager.table("b") is None
    again = manager.allocate("w0", "c", "s", prefix + [1], 100, 2.0)
    assert again is not None and again.num_cached_tokens == 2 * BLOCK_SIZE


def test_allocating_an_existing_request_raises(manager: BlockManager) -> None:
    manager.allocate("w0", "a", "s", [1], 1, 0.0)
    with pytest.raises(BlockManagerError, match="already has a block table"):
        manager.allocate("w0", "a", "s", [1], 1, 0.0)


def test_allocating_in_an_unknown_pool_raises(manager: BlockManager) -> None:
    with pytest.raises(UnknownPoolError, match="nope"):
        manager.allocate("nope", "a", "s", [1], 1, 0.0)


def test_grow_within_the_last_block_changes_no_block(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", [1], 1, 0.0)
    assert a is not None
    growth = manager.grow("a", BLOCK_SIZE - 1, [2], 1.0)
    assert growth is UNCHANGED
    assert manager.table("a") == a.block_ids


def test_grow_past_the_last_block_appends_fresh_blocks(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(BLOCK_SIZE), BLOCK_SIZE, 0.0)
    assert a is not None
    growth = manager.grow("a", 2 * BLOCK_SIZE + 1, [], 1.0)
    assert growth is not None and len(growth.new_block_ids) == 3
    assert growth.replaced == () and growth.copies == ()
    assert manager.table("a") == a.block_ids + list(growth.new_block_ids)


def test_failed_grow_changes_nothing(manager: BlockManager) -> None:
    manager.allocate("w0", "a", "s", tokens(BLOCK_SIZE), BLOCK_SIZE, 0.0)
    before = manager.snapshot(0.0)
    assert manager.grow("a", NUM_BLOCKS * BLOCK_SIZE, [5, 6], 1.0) is None
    assert manager.snapshot(0.0) == before  # lease expiry included
    growth = manager.grow("a", 1, [7], 1.0)
    assert growth is not None and len(growth.new_block_ids) == 1


def test_growing_an_unknown_request_raises(manager: BlockManager) -> None:
    with pytest.raises(UnknownRequestError, match="ghost"):
        manager.grow("ghost", 1, [], 0.0)


def test_fork_shares_every_block_of_the_parent(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(BLOCK_SIZE + 2), 100, 0.0)
    assert a is not None
    assert manager.fork("a", "a.1", "s", 0.0) is True
    assert manager.table("a.1") == a.block_ids
    refs = ref_counts(manager)
    assert all(refs[i] == 2 for i in a.block_ids)


def test_write_into_shared_block_produces_exactly_one_copy(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(BLOCK_SIZE + 2), 100, 0.0)
    assert a is not None
    manager.fork("a", "a.1", "s", 0.0)
    shared_tail = a.block_ids[1]
    growth = manager.grow("a.1", 1, [], 1.0)
    assert growth is not None
    assert len(growth.copies) == 1 and growth.copies[0][0] == shared_tail
    copy = growth.copies[0][1]
    assert growth.replaced == ((1, copy),) and growth.new_block_ids == ()
    assert manager.table("a.1") == [a.block_ids[0], copy]
    # The tail is the parent's alone again: its own write copies nothing.
    assert manager.grow("a", 1, [], 1.0) is UNCHANGED
    assert manager.grow("a.1", 1, [], 1.0) is UNCHANGED
    refs = ref_counts(manager)
    assert (refs[a.block_ids[0]], refs[shared_tail], refs[copy]) == (2, 1, 1)


def test_write_after_a_full_shared_block_copies_nothing(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", tokens(BLOCK_SIZE), 100, 0.0)
    assert a is not None
    manager.fork("a", "a.1", "s", 0.0)
    growth = manager.grow("a.1", 1, [], 1.0)
    assert growth is not None and growth.copies == () and len(growth.new_block_ids) == 1


def test_free_returns_blocks_whose_last_reference_went(manager: BlockManager) -> None:
    manager.allocate("w0", "a", "s", tokens(2 * BLOCK_SIZE + 1), 100, 0.0)
    manager.fork("a", "a.1", "s", 0.0)
    assert manager.free("a") == 0
    assert manager.free("a.1") == 3
    assert manager.num_free_blocks("w0") == NUM_BLOCKS


def test_free_is_idempotent(manager: BlockManager) -> None:
    manager.allocate("w0", "a", "s", [1], 1, 0.0)
    assert manager.free("a") == 1
    assert manager.free("a") == 0
    assert manager.free("never-seen") == 0


def test_table_is_a_copy_the_caller_may_keep(manager: BlockManager) -> None:
    a = manager.allocate("w0", "a", "s", [1], 1, 0.0)
    assert a is not None
    a.block_ids.append(99)
    table = manager.table("a")
    assert table is not None and table.append(98) is None
    assert manager.table("a") == a.block_ids[:1]
    assert manager.check_invariants() == []


def test_readding_a_pool_drops_its_old_tables(manager: BlockManager) -> None:
    manager.allocate("w0", "a", "s", [1], 1, 0.0)
    manager.add_pool("w0", 8, 8)
    assert manager.table("a") is None
    assert manager.pools() == {"w0": (8, 8)}
    assert manager.num_free_blocks("w0") == 8
