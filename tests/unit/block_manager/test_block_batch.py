"""The batched RPC `apply` and its wire form (shared/protocol/blocks.py)."""

from __future__ import annotations

import msgpack
import pytest
from block_views import BLOCK_SIZE, NUM_BLOCKS, tokens

from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.shared.protocol import decode
from pagedserve.shared.protocol.blocks import (
    BLOCK_OPS,
    Allocation,
    BlockBatch,
    BlockOpError,
    BlockReply,
    Growth,
    alloc_op,
    alloc_result,
    fork_op,
    fork_result,
    free_op,
    grow_op,
    grow_result,
)
from pagedserve.shared.protocol.messages import encode_message


def test_apply_runs_ops_in_order_and_returns_one_result_each(manager: BlockManager) -> None:
    reply = manager.apply(
        [
            alloc_op("w0", "a", "s", tokens(BLOCK_SIZE + 1), 100),
            fork_op("a", "a.1", "s"),
            grow_op("a.1", 1, [7]),
            free_op("a"),
        ],
        0.0,
    )
    alloc, fork, grow, freed = reply.results
    assert alloc == [[0, 1], 0, BLOCK_SIZE + 1]
    assert fork is True
    assert grow == [[], [[1, 2]], [[1, 2]]]  # the shared tail copied into block 2
    assert freed == 1  # after the copy, block 1 was a's alone
    assert reply.free_blocks == {"w0": NUM_BLOCKS - 2}


def test_apply_reports_errors_per_op_without_raising(manager: BlockManager) -> None:
    reply = manager.apply(
        [
            ["alloc", "nope", "a", "s", [1], 1, True],  # unknown pool
            ["grow", "ghost", 1, []],  # unknown request
            ["alloc", "w0", "b", "s", [1], 1, True],  # fine
            ["alloc", "w0", "b", "s", [1], 1, True],  # duplicate
            ["grow", "b", -1, []],  # negative count
            ["grow", "b", 1],  # arity
            ["alloc", "w0", "c", "s", "not tokens", 1, True],  # types
            ["alloc", "w0", "c", "s", [1, None], 1, True],
            ["alloc", "w0", "c", "s", [1], 1, True, 3],  # a cache namespace that is no string
            ["teleport", "b"],  # unknown op
            "free",  # not a list
            [],
            ["free", {"id": 1}, None],
            ["renew", ["b"]],  # an op that no longer exists
            ["fork", "ghost", "child", "s"],
            ["free", "b", None],  # still runs after all of the above
        ],
        0.0,
    )
    results = reply.results
    assert len(results) == 16
    assert results[2] == [[0], 0, 1] and results[15] == 1
    errors = [r for i, r in enumerate(results) if i not in (2, 15)]
    assert all(type(r) is dict and isinstance(r["error"], str) and r["error"] for r in errors)
    assert "nope" in results[0]["error"] and "ghost" in results[1]["error"]
    assert "cache_namespace" in results[8]["error"] and "teleport" in results[9]["error"]
    assert manager.check_invariants() == [] and manager.num_free_blocks("w0") == NUM_BLOCKS


def test_apply_reports_not_enough_blocks_as_none(manager: BlockManager) -> None:
    reply = manager.apply([alloc_op("w0", "a", "s", tokens(NUM_BLOCKS * BLOCK_SIZE + 1), 10_000)], 0.0)
    assert reply.results == [None]


def test_batch_and_reply_frames_round_trip_through_msgpack(manager: BlockManager) -> None:
    ops = [
        alloc_op("w0", "a", "s", (1, 2, 3), 3),
        grow_op("a", 2, (4,)),
        fork_op("a", "b", "s"),
        free_op("b"),
    ]
    message = decode(encode_message(BlockBatch(7, ops)))
    assert message["type"] == BLOCK_OPS
    batch = BlockBatch.from_wire(message)
    seq, got_ops = batch.seq, batch.ops
    assert seq == 7 and got_ops == ops
    reply = manager.apply(got_ops, 0.0)
    got = BlockReply.from_wire(decode(encode_message(BlockReply(seq, reply.results, reply.free_blocks))))
    seq, results, free_blocks = got.seq, got.results, got.free_blocks
    assert seq == 7 and free_blocks == {"w0": NUM_BLOCKS - 2}
    assert alloc_result(results[0]) == Allocation([0], 0, 3)
    assert grow_result(results[1]) == Growth((1,), (), ())
    assert fork_result(results[2]) is True
    assert results[3] == 0  # free: no block hit ref count 0 (the fork still holds them)


def test_result_readers_raise_on_an_error_result() -> None:
    with pytest.raises(BlockOpError, match="unknown pool"):
        alloc_result({"error": "alloc: unknown pool 'x'"})
    assert alloc_result(None) is None and grow_result(None) is None


def test_unchanged_growth_survives_the_wire_as_one_shared_value() -> None:
    wire = msgpack.unpackb(msgpack.packb(Growth().to_wire()))
    assert grow_result(wire) is grow_result([[], [], []])
