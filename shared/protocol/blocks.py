"""Scheduler <-> block manager: one batch of ops per engine step, one reply.

    op (BlockOp)                                                result (BlockResult; None: too few free blocks)
    Alloc(pool_id, request_id, owner, token_ids, max_new_tokens, use_prefix_cache, cache_namespace)
                                                                Allocation | None
    Grow(request_id, num_new_tokens, new_token_ids)             Growth | None
    Fork(parent_id, child_id, owner)                            Forked | None
    Free(request_id, num_computed)                              Freed (blocks whose ref count hit 0)
    Resume(request_id, num_slots, num_new_tokens, new_token_ids)
                                                                Resumption | None
    any op the block manager refuses                            OpError (unknown pool or request, ...)

    frames: BlockBatch {seq, ops} -> BlockReply {seq, results: [one per op, in order],
            free_blocks: {pool_id: n}, instance}

Ops and results are tagged array-like Structs (on the wire `["grow", "req-1", 1, [17]]`): one runs
per running request per step, so no field names cross, and msgspec checks every type while it reads.
The in-process engine hands the block manager the same Structs.

`use_prefix_cache` false: no prefix-cache hits, every slot is computed (a request that wants its
prompt's logprobs needs a hidden state at every position). Its full blocks are still offered to the
cache for others. `cache_namespace`: the request's LoRA adapter; its blocks hit only within it.

`num_computed` of a free is how many of the table's slots the owner saw computed (None: all of
them): the prefix cache keeps only blocks it knows were written (services/block_manager/pool.py).

`resume` takes a table whose worker died and came back with its pool intact (a shared-memory segment)
back to the `num_slots` its owner saw committed, then grows it like `grow`; it answers the whole
table, which the restarted worker needs, and the copies to make first.

An op with more arguments than declared is read without the extra ones (msgspec's rule for
array-like Structs): a newer peer may append an optional argument. One bad op never costs its
neighbours: an op the reader cannot read becomes `Unreadable` in its slot (`read_batch`), the block
manager answers it with an OpError, and the other ops of the batch still run (a free that did not
run would hold its blocks until the lease reaper came). Frames carry a `seq` so a caller that timed
out can tell a late reply from the one it waits for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, ClassVar, Union

import msgspec
from msgspec import Meta

from pagedserve.shared.protocol.structs import decoder

Name = Annotated[str, Meta(min_length=1)]
Count = Annotated[int, Meta(ge=0)]


class _Op(msgspec.Struct, array_like=True, frozen=True):
    pass


class Alloc(_Op, tag="alloc", frozen=True):
    pool_id: Name
    request_id: Name
    owner: Name
    token_ids: Sequence[int]
    max_new_tokens: Count
    use_prefix_cache: bool = True
    cache_namespace: Name | None = None


class Grow(_Op, tag="grow", frozen=True):
    request_id: Name
    num_new_tokens: Count
    new_token_ids: Sequence[int] = ()


class Fork(_Op, tag="fork", frozen=True):
    parent_id: Name
    child_id: Name
    owner: Name


class Free(_Op, tag="free", frozen=True):
    """Free a table; `num_computed` below its slots says the rest may never have been written."""

    request_id: Name
    num_computed: Count | None = None


class Resume(_Op, tag="resume", frozen=True):
    request_id: Name
    num_slots: Count
    num_new_tokens: Count
    new_token_ids: Sequence[int] = ()


class Unreadable(_Op, tag="unreadable", frozen=True):
    """Not an op: the slot of one the reader could not read (`read_batch`), answered by its OpError."""

    reason: str


BlockOp = Union[Alloc, Grow, Fork, Free, Resume, Unreadable]  # noqa: UP007 (msgspec reads a Union)


# ---------------------------------------------------------------- results


class _Result(msgspec.Struct, array_like=True, frozen=True):
    pass


class Allocation(_Result, tag="allocation", frozen=True):
    """A new block table: the first num_cached_tokens slots are prefix-cache hits (already
    computed); the next num_new_tokens slots are this step's to compute."""

    block_ids: list[int]
    num_cached_tokens: int
    num_new_tokens: int


class Growth(_Result, tag="growth", frozen=True):
    """What one grow changed: blocks appended to the table, blocks replaced in it by
    copy-on-write (logical index, new id), and the copies the worker must make (src, dst)
    before it writes.

    Read-only (tuples, frozen): most decode steps change no block, and in-process they all share
    one UNCHANGED instance instead of building three fresh lists per request per step.
    """

    new_block_ids: tuple[int, ...] = ()
    replaced: tuple[tuple[int, int], ...] = ()
    copies: tuple[tuple[int, int], ...] = ()


UNCHANGED = Growth()


class Resumption(_Result, tag="resumption", frozen=True):
    """A table taken back to its committed slots and grown: all of it, and the copies to make first."""

    block_ids: list[int]
    copies: list[tuple[int, int]]


class Forked(_Result, tag="forked", frozen=True):
    pass


FORKED = Forked()


class Freed(_Result, tag="freed", frozen=True):
    num_blocks: int  # how many of the table's blocks became free (the rest are shared or cached)


class OpError(_Result, tag="error", frozen=True):
    """The block manager refused the op: unknown pool or request, bad arguments, a broken rule."""

    message: str


BlockResult = Union[Allocation, Growth, Resumption, Forked, Freed, OpError, None]  # noqa: UP007


# ---------------------------------------------------------------- frames


class BlockBatch(msgspec.Struct):
    """scheduler -> block manager: the ops of one step."""

    TYPE: ClassVar[str] = "block_ops"

    seq: int
    ops: list[BlockOp]


class BlockAnswers(msgspec.Struct):
    """The block manager's answer to one batch, in-process (`BlockManager.apply`) or off a BlockReply:
    one result per op, in order, and every pool's free blocks after the batch."""

    results: list[BlockResult]
    free_blocks: dict[str, int]


class BlockReply(msgspec.Struct):
    """block manager -> scheduler: one result per op, in order, and every pool's free blocks.

    `instance` changes on every start of the block manager: a new one means every table is gone."""

    TYPE: ClassVar[str] = "block_reply"

    seq: int
    results: list[BlockResult]
    free_blocks: dict[str, int]
    instance: str = ""

    @property
    def answer(self) -> BlockAnswers:
        """The reply as `BlockManager.apply` answers in-process."""
        return BlockAnswers(self.results, self.free_blocks)


class _LooseBatch(msgspec.Struct):
    seq: int
    ops: list[msgspec.Raw]


def read_batch(body: bytes) -> BlockBatch:
    """A BlockBatch off the wire. A batch with a bad op is read again op by op, so that only that op
    is refused (as `Unreadable`, naming its path); a bad `seq` or `ops` still refuses the frame."""
    try:
        return decoder(BlockBatch).decode(body)
    except msgspec.ValidationError:
        loose = decoder(_LooseBatch).decode(body)
    read_op = decoder(BlockOp).decode
    ops: list[BlockOp] = []
    for index, raw in enumerate(loose.ops):
        try:
            ops.append(read_op(raw))
        except msgspec.ValidationError as exc:
            # msgspec names the path within the op (`$[2]`), or none when the op itself is wrong.
            where, said = f"`$.ops[{index}]", str(exc)
            ops.append(Unreadable(said.replace("`$", where) if "`$" in said else f"{said} - at {where}`"))
    return BlockBatch(loose.seq, ops)
