"""Scheduler <-> block manager: one batch of ops per engine step, one reply.

Hot path, so plain lists (no field names, no per-field validation beyond the frame's version):

    op                                                          result (None: not enough free blocks)
    ["alloc", pool_id, request_id, owner, token_ids, max_new, use_prefix_cache]
                                                                [block_ids, num_cached_tokens, num_new_tokens] | None
    ["grow", request_id, num_new_tokens, new_token_ids]         [new_block_ids, [[idx, id]...], [[src, dst]...]] | None
    ["fork", parent_id, child_id, owner]                        True | None
    ["free", request_id, num_computed]                          blocks whose ref count hit 0
    ["resume", request_id, num_slots, num_new_tokens, new_token_ids]
                                                                [block_ids, [[src, dst]...]] | None

    frames: BlockBatch {seq, ops} -> BlockReply {seq, results: [one per op, in order],
            free_blocks: {pool_id: n}, instance}

`use_prefix_cache` false: no prefix-cache hits, every slot is computed (a request that wants its
prompt's logprobs needs a hidden state at every position). Its full blocks are still offered to the
cache for others.

`num_computed` of a free is how many of the table's slots the owner saw computed (nil: all of
them): the prefix cache keeps only blocks it knows were written (services/block_manager/pool.py).

`resume` takes a table whose worker died and came back with its pool intact (a shared-memory segment)
back to the `num_slots` its owner saw committed, then grows it like `grow`; it answers the whole
table, which the restarted worker needs, and the copies to make first.

An op naming an unknown pool or request, or with malformed arguments, has `{"error": message}`
as its result; the other ops of the batch still run. Frames carry a `seq` so a caller that timed
out can tell a late reply from the one it waits for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pagedserve.shared.protocol.codec import ProtocolError

BLOCK_OPS = "block_ops"  # frame type: scheduler -> block manager
BLOCK_REPLY = "block_reply"  # frame type: block manager -> scheduler

OP_ALLOC = "alloc"
OP_GROW = "grow"
OP_FORK = "fork"
OP_FREE = "free"
OP_RESUME = "resume"
OP_ARITY = {OP_ALLOC: 7, OP_GROW: 4, OP_FORK: 4, OP_FREE: 3, OP_RESUME: 5}  # list length, name included
# Trailing arguments an op may add, sent only when set (older peers keep working):
# alloc's cache namespace (the request's LoRA adapter).
OP_OPTIONAL = {OP_ALLOC: 1}


class BlockOpError(Exception):
    """The block manager refused one op (unknown pool or request, malformed arguments)."""


@dataclass(slots=True)
class Allocation:
    """A new block table: the first num_cached_tokens slots are prefix-cache hits (already
    computed); the next num_new_tokens slots are this step's to compute."""

    block_ids: list[int]
    num_cached_tokens: int
    num_new_tokens: int

    def to_wire(self) -> list[Any]:
        return [self.block_ids, self.num_cached_tokens, self.num_new_tokens]

    @classmethod
    def from_wire(cls, w: list[Any]) -> Allocation:
        return cls(w[0], w[1], w[2])


@dataclass(slots=True)
class Growth:
    """What one grow changed: blocks appended to the table, blocks replaced in it by
    copy-on-write (logical index, new id), and the copies the worker must make (src, dst)
    before it writes.

    A read-only value (tuples): most decode steps change no block, and they all share one
    UNCHANGED instance instead of building three fresh lists per request per step.
    """

    new_block_ids: tuple[int, ...] = ()
    replaced: tuple[tuple[int, int], ...] = ()
    copies: tuple[tuple[int, int], ...] = ()

    def to_wire(self) -> list[Any]:
        return [list(self.new_block_ids), [list(p) for p in self.replaced], [list(c) for c in self.copies]]

    @classmethod
    def from_wire(cls, w: list[Any]) -> Growth:
        if not (w[0] or w[1] or w[2]):
            return UNCHANGED
        return cls(
            tuple(w[0]), tuple((int(i), int(b)) for i, b in w[1]), tuple((int(s), int(d)) for s, d in w[2])
        )


UNCHANGED = Growth()


# ---------------------------------------------------------------- building a batch


def alloc_op(
    pool_id: str,
    request_id: str,
    owner: str,
    token_ids: Sequence[int],
    max_new_tokens: int,
    use_prefix_cache: bool = True,
    cache_namespace: str | None = None,
) -> list[Any]:
    op = [OP_ALLOC, pool_id, request_id, owner, list(token_ids), max_new_tokens, use_prefix_cache]
    if cache_namespace is not None:
        op.append(cache_namespace)
    return op


def grow_op(request_id: str, num_new_tokens: int, new_token_ids: Sequence[int] = ()) -> list[Any]:
    return [OP_GROW, request_id, num_new_tokens, list(new_token_ids)]


def fork_op(parent_id: str, child_id: str, owner: str) -> list[Any]:
    return [OP_FORK, parent_id, child_id, owner]


def resume_op(
    request_id: str, num_slots: int, num_new_tokens: int, new_token_ids: Sequence[int] = ()
) -> list[Any]:
    return [OP_RESUME, request_id, num_slots, num_new_tokens, list(new_token_ids)]


def free_op(request_id: str, num_computed: int | None = None) -> list[Any]:
    """Free a table; `num_computed` below its slots says the rest may never have been written."""
    return [OP_FREE, request_id, num_computed]


# ---------------------------------------------------------------- frames


@dataclass(slots=True)
class BlockBatch:
    """scheduler -> block manager: the ops of one step. Each op is checked later, one by one."""

    TYPE: ClassVar[str] = BLOCK_OPS

    seq: int
    ops: list[list[Any]]

    def to_wire(self) -> dict[str, Any]:
        return {"seq": self.seq, "ops": self.ops}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> BlockBatch:
        seq, ops = body.get("seq"), body.get("ops")
        if type(seq) is not int:
            raise ProtocolError(
                "bad_frame", f"field 'seq' of {BLOCK_OPS} must be an int, got {type(seq).__name__}"
            )
        if type(ops) is not list:
            raise ProtocolError(
                "bad_frame", f"field 'ops' of {BLOCK_OPS} must be a list, got {type(ops).__name__}"
            )
        return cls(seq, ops)


@dataclass(slots=True)
class BlockAnswers:
    """The block manager's answer to one batch, in-process (`BlockManager.apply`) or off a BlockReply:
    one result per op, in order, and every pool's free blocks after the batch."""

    results: list[Any]
    free_blocks: dict[str, int]


@dataclass(slots=True)
class BlockReply:
    """block manager -> scheduler: one result per op, in order, and every pool's free blocks.

    `instance` changes on every start of the block manager: a new one means every table is gone."""

    TYPE: ClassVar[str] = BLOCK_REPLY

    seq: int
    results: list[Any]
    free_blocks: dict[str, int]
    instance: str = ""

    @property
    def answer(self) -> BlockAnswers:
        """The reply as `BlockManager.apply` answers in-process."""
        return BlockAnswers(self.results, self.free_blocks)

    def to_wire(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "results": self.results,
            "free_blocks": self.free_blocks,
            "instance": self.instance,
        }

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> BlockReply:
        seq, results, free_blocks = body.get("seq"), body.get("results"), body.get("free_blocks")
        instance = body.get("instance", "")
        if (
            type(seq) is not int
            or type(results) is not list
            or type(free_blocks) is not dict
            or type(instance) is not str
        ):
            raise ProtocolError(
                "bad_frame",
                f"{BLOCK_REPLY} needs 'seq' (int), 'results' (list), 'free_blocks' (map), 'instance' (str)",
            )
        return cls(seq, results, free_blocks, instance)


# ---------------------------------------------------------------- reading results


def error_result(message: str) -> dict[str, str]:
    return {"error": message}


def _raise_if_error(result: Any) -> None:
    if type(result) is dict:
        raise BlockOpError(str(result.get("error", result)))


def alloc_result(result: Any) -> Allocation | None:
    """The Allocation, or None when the pool had too few free blocks; raises BlockOpError."""
    _raise_if_error(result)
    return None if result is None else Allocation.from_wire(result)


def grow_result(result: Any) -> Growth | None:
    _raise_if_error(result)
    return None if result is None else Growth.from_wire(result)


@dataclass(slots=True)
class Resumption:
    """A table taken back to its committed slots and grown: all of it, and the copies to make first."""

    block_ids: list[int]
    copies: list[tuple[int, int]]


def resume_result(result: Any) -> Resumption | None:
    _raise_if_error(result)
    if result is None:
        return None
    return Resumption(list(result[0]), [(int(s), int(d)) for s, d in result[1]])


def fork_result(result: Any) -> bool:
    _raise_if_error(result)
    return result is True
