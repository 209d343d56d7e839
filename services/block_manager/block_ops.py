"""The batched RPC: the ops of one engine step, applied in order, one result each.

The ops arrive typed (shared/protocol/blocks.py: msgspec checked every field while it read them),
so what is left to refuse is the core's: an unknown pool or request, a table that already exists.
A refused op becomes an OpError in its slot and the batch goes on: one bad op must never kill the
service or skip its neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pagedserve.shared.protocol.blocks import (
    FORKED,
    Alloc,
    BlockAnswers,
    BlockOp,
    BlockResult,
    Fork,
    Free,
    Freed,
    Grow,
    OpError,
    Resume,
    Resumption,
    Unreadable,
)

if TYPE_CHECKING:
    from pagedserve.services.block_manager.manager import BlockManager


def apply_ops(manager: BlockManager, ops: Sequence[BlockOp], now: float) -> BlockAnswers:
    results: list[BlockResult] = []
    append = results.append
    for op in ops:
        try:
            append(_apply(manager, op, now))
        except ValueError as exc:  # the core's refusals (BlockManagerError)
            append(OpError(f"{_name(op)}: {exc}"))
        except Exception as exc:  # anything else is still this op's failure, not the service's
            append(OpError(f"{_name(op)}: {type(exc).__name__}: {exc}"))
    return BlockAnswers(results, manager.free_blocks())


def _apply(manager: BlockManager, op: BlockOp, now: float) -> BlockResult:
    # Grow first: one per running request per step, the rest are rare.
    if type(op) is Grow:
        return manager.grow(op.request_id, op.num_new_tokens, op.new_token_ids, now)
    if type(op) is Alloc:
        return manager.allocate(
            op.pool_id,
            op.request_id,
            op.owner,
            op.token_ids,
            op.max_new_tokens,
            now,
            use_prefix_cache=op.use_prefix_cache,
            cache_namespace=op.cache_namespace,
        )
    if type(op) is Free:
        return Freed(manager.free(op.request_id, op.num_computed))
    if type(op) is Fork:
        return FORKED if manager.fork(op.parent_id, op.child_id, op.owner, now) else None
    if type(op) is Resume:
        growth = manager.resume(op.request_id, op.num_slots, op.num_new_tokens, op.new_token_ids, now)
        return None if growth is None else Resumption(manager.table(op.request_id) or [], list(growth.copies))
    if type(op) is Unreadable:
        return OpError(op.reason)
    return OpError(f"not a block op: {type(op).__name__}")  # in-process callers only: the wire is typed


def _name(op: BlockOp) -> str:
    return type(op).__name__.lower()
