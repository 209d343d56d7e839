"""The batched RPC `apply` and its wire form (shared/protocol/blocks.py)."""

from __future__ import annotations

import msgspec
import pytest
from block_views import BLOCK_SIZE, NUM_BLOCKS, tokens

from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.shared.protocol import decode
from pagedserve.shared.protocol.blocks import (
    UNCHANGED,
    Alloc,
    Allocation,
    BlockBatch,
    BlockReply,
    Fork,
    Forked,
    Free,
    Freed,
    Grow,
    Growth,
    OpError,
    Resume,
    read_batch,
)
from pagedserve.shared.protocol.codec import ProtocolError
from pagedserve.shared.protocol.messages import encode_message, read_message


def wire_batch(ops: list) -> BlockBatch:
    """A batch as a peer wrote it (ops as raw msgpack lists), read the way the block manager reads it."""
    return read_batch(msgspec.msgpack.encode({"seq": 1, "ops": ops}))


def test_apply_runs_ops_in_order_and_returns_one_result_each(manager: BlockManager) -> None:
    reply = manager.apply(
        [
            Alloc("w0", "a", "s", tokens(BLOCK_SIZE + 1), 100),
            Fork("a", "a.1", "s"),
            Grow("a.1", 1, [7]),
            Free("a"),
        ],
        0.0,
    )
    alloc, fork, grow, freed = reply.results
    assert alloc == Allocation([0, 1], 0, BLOCK_SIZE + 1)
    assert fork == Forked()
    assert grow == Growth((), ((1, 2),), ((1, 2),))  # the shared tail copied into block 2
    assert freed == Freed(1)  # after the copy, block 1 was a's alone
    assert reply.free_blocks == {"w0": NUM_BLOCKS - 2}


def test_a_bad_op_is_refused_alone_naming_its_field_and_its_neighbours_run(manager: BlockManager) -> None:
    prompt = [1]
    batch = wire_batch(
        [
            ["alloc", "nope", "a", "s", prompt, 1, True],  # unknown pool
            ["grow", "ghost", 1, []],  # unknown request
            ["alloc", "w0", "b", "s", prompt, 1, True],  # fine
            ["alloc", "w0", "b", "s", prompt, 1, True],  # duplicate
            ["grow", "b", -1, []],  # negative count
            ["grow", "b"],  # too few arguments
            ["alloc", "w0", "c", "s", "not tokens", 1, True],  # types
            ["alloc", "w0", "c", "s", [1, None], 1, True],
            ["alloc", "w0", "c", "s", prompt, 1, True, 3],  # a cache namespace that is no string
            ["teleport", "b"],  # unknown op
            "free",  # not a list
            [],
            ["free", {"id": 1}, None],
            ["renew", ["b"]],  # an op that no longer exists
            ["fork", "ghost", "child", "s"],
            ["free", "b", True],  # a bool is no count
            ["free", "b", None],  # still runs after all of the above
        ]
    )
    results = manager.apply(batch.ops, 0.0).results
    assert len(results) == 17
    assert results[2] == Allocation([0], 0, 1) and results[16] == Freed(1)
    errors = [r for i, r in enumerate(results) if i not in (2, 16)]
    assert all(type(r) is OpError and r.message for r in errors), errors
    messages = [r.message for r in errors]
    assert "nope" in messages[0] and "ghost" in messages[1] and "already" in messages[2]
    assert "$.ops[4][2]" in messages[3] and ">= 0" in messages[3]  # the path names the field
    assert "$.ops[8][7]" in messages[7] and "teleport" in messages[8]
    assert "$.ops[10]`" in messages[9] and "$.ops[15][2]" in messages[14] and "bool" in messages[14]
    assert manager.check_invariants() == [] and manager.num_free_blocks("w0") == NUM_BLOCKS


def test_a_batch_whose_frame_is_bad_is_refused_whole_naming_the_field() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\.seq"):
        read_batch(msgspec.msgpack.encode({"seq": "1", "ops": []}))
    frame = decode(encode_message(BlockBatch(1, [])))
    frame["body"] = msgspec.msgpack.encode({"seq": 1, "ops": {}})
    with pytest.raises(ProtocolError, match=r"block_ops: .*\$\.ops") as info:
        read_message(frame)
    assert info.value.code == "bad_fields"


def test_apply_reports_not_enough_blocks_as_none(manager: BlockManager) -> None:
    reply = manager.apply([Alloc("w0", "a", "s", tokens(NUM_BLOCKS * BLOCK_SIZE + 1), 10_000)], 0.0)
    assert reply.results == [None]


def test_batch_and_reply_frames_round_trip_through_the_wire(manager: BlockManager) -> None:
    ops = [Alloc("w0", "a", "s", [1, 2, 3], 3), Grow("a", 2, [4]), Fork("a", "b", "s"), Free("b")]
    batch = read_message(decode(encode_message(BlockBatch(7, ops))))
    assert batch == BlockBatch(7, ops)
    reply = manager.apply(batch.ops, 0.0)
    got = read_message(decode(encode_message(BlockReply(7, reply.results, reply.free_blocks, "bm-1"))))
    assert got == BlockReply(
        7, [Allocation([0], 0, 3), Growth((1,)), Forked(), Freed(0)], {"w0": NUM_BLOCKS - 2}, "bm-1"
    )


def test_an_unchanged_growth_is_the_shared_value_in_process_and_equal_to_it_off_the_wire(
    manager: BlockManager,
) -> None:
    manager.allocate("w0", "a", "s", tokens(3), 3, 0.0)
    assert manager.apply([Grow("a", 1, [5])], 0.0).results[0] is UNCHANGED  # slot 4 is in block 0
    frame = encode_message(BlockReply(1, [UNCHANGED], {}))
    assert read_message(decode(frame)).results == [UNCHANGED]


def test_resume_answers_the_whole_table(manager: BlockManager) -> None:
    alloc = manager.allocate("w0", "a", "s", tokens(BLOCK_SIZE + 2), 100, 0.0)
    assert alloc is not None
    (resumed,) = manager.apply([Resume("a", BLOCK_SIZE + 2, 1, [7])], 0.0).results
    assert resumed.block_ids == alloc.block_ids and resumed.copies == []


def test_arguments_past_the_declared_ones_are_ignored_for_newer_peers(manager: BlockManager) -> None:
    (op,) = wire_batch([["free", "a", 3, "a newer peer's option"]]).ops
    assert op == Free("a", 3)
