"""A step's forward inputs to and from their wire form (shared/protocol/ranks.py).

Rank 0 packs the batch once (packed_batch.py) and sends the tensors as they are; a rank > 0 rebuilds
them on its own device. A few kilobytes a step: the cost is the send, not the copy.
"""

from __future__ import annotations

import torch

from pagedserve.kernels.attention import AttentionMetadata
from pagedserve.services.worker.packed_batch import PackedBatch
from pagedserve.shared.protocol.ranks import ForwardBatch, WireTensor


def wire_tensor(tensor: torch.Tensor) -> WireTensor:
    host = tensor.detach().contiguous().cpu()
    return WireTensor(str(host.dtype).removeprefix("torch."), list(host.shape), host.numpy().tobytes())


def local_tensor(wire: WireTensor, device: torch.device) -> torch.Tensor:
    dtype = getattr(torch, wire.dtype)
    if not wire.data:  # frombuffer refuses an empty buffer
        return torch.empty(wire.shape, dtype=dtype, device=device)
    # bytearray: a writable copy (frombuffer over bytes warns, and the kernels may write in place).
    return torch.frombuffer(bytearray(wire.data), dtype=dtype).reshape(wire.shape).to(device)


def forward_batch(batch: PackedBatch, long_tokens: torch.Tensor | None) -> ForwardBatch:
    meta = batch.meta
    return ForwardBatch(
        input_ids=wire_tensor(batch.input_ids),
        positions=wire_tensor(batch.positions),
        slot_mapping=wire_tensor(meta.slot_mapping),
        query_start_loc=wire_tensor(meta.query_start_loc),
        seq_lens=wire_tensor(meta.seq_lens),
        block_tables=wire_tensor(meta.block_tables),
        max_query_len=meta.max_query_len,
        max_seq_len=meta.max_seq_len,
        query_lens_cpu=meta.query_lens_cpu,
        seq_lens_cpu=meta.seq_lens_cpu,
        long_tokens=None if long_tokens is None else wire_tensor(long_tokens),
    )


def forward_inputs(
    wire: ForwardBatch, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor | None]:
    """-> (input_ids, positions, meta, long_tokens): the model's arguments besides the KV caches."""
    meta = AttentionMetadata(
        slot_mapping=local_tensor(wire.slot_mapping, device),
        query_start_loc=local_tensor(wire.query_start_loc, device),
        seq_lens=local_tensor(wire.seq_lens, device),
        block_tables=local_tensor(wire.block_tables, device),
        max_query_len=wire.max_query_len,
        max_seq_len=wire.max_seq_len,
        query_lens_cpu=wire.query_lens_cpu,
        seq_lens_cpu=wire.seq_lens_cpu,
    )
    long_tokens = None if wire.long_tokens is None else local_tensor(wire.long_tokens, device)
    return local_tensor(wire.input_ids, device), local_tensor(wire.positions, device), meta, long_tokens
