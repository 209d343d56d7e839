"""Rank 0 -> the other ranks of a tensor-parallel worker group (services/worker/tensor_parallel).

    attach_pool   rank 0 sized its KV pool: allocate as many blocks (of your kv heads)
    forward       one step: copy these blocks, then run the forward of this packed batch

Inside one group, over an ipc socket each rank binds: rank 0 does all the bookkeeping (request
states, block tables, sampling) and the others only compute. Tensors travel as raw bytes with their
dtype and shape (`WireTensor`); the group's processes run the same installed code, and nothing here
is pickled.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from pagedserve.shared.protocol.structs import ENCODER, decoder


class WireTensor(msgspec.Struct, array_like=True):
    dtype: str  # torch's name without the prefix: int64, int32, bool
    shape: list[int]
    data: bytes


class AttachPool(msgspec.Struct, array_like=True, tag="attach_pool"):
    num_blocks: Annotated[int, Meta(ge=1)]


class ForwardBatch(msgspec.Struct, array_like=True):
    input_ids: WireTensor
    positions: WireTensor
    slot_mapping: WireTensor
    query_start_loc: WireTensor
    seq_lens: WireTensor
    block_tables: WireTensor
    max_query_len: int
    max_seq_len: int
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    long_tokens: WireTensor | None  # LongRoPE models only


class Forward(msgspec.Struct, array_like=True, tag="forward"):
    """The inputs of one step's forward: exactly what ModelRunner passes its model (packed_batch.py)."""

    copies: list[tuple[int, int]]  # copy-on-write (src block, dst block), before the forward
    batch: ForwardBatch | None  # None: a step that only copies blocks


RankOrder = AttachPool | Forward


def encode_order(order: RankOrder) -> bytes:
    return ENCODER.encode(order)


def decode_order(frame: bytes) -> RankOrder:
    return decoder(RankOrder).decode(frame)
