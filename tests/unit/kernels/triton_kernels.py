"""The Triton attention kernels called as the tests call them: over a whole step's batch, into an
output filled with NaN, so that a row a kernel leaves unwritten shows."""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton_env  # noqa: F401  (before any kernels import: selects the Triton interpreter)

from pagedserve.kernels.paged_reference import PagedBatch
from pagedserve.kernels.triton.decode_attention import decode_attention
from pagedserve.kernels.triton.prefill_attention import prefill_attention


def run_decode(batch: PagedBatch, scale: float, **kwargs) -> torch.Tensor:
    """decode_attention (one query per request) up to the batch's longest context."""
    return _run(decode_attention, batch, scale, max_seq_len=max(batch.seq_lens_list), **kwargs)


def run_prefill(batch: PagedBatch, scale: float, **kwargs) -> torch.Tensor:
    """prefill_attention (several queries per request) up to the batch's longest query."""
    return _run(prefill_attention, batch, scale, max_query_len=max(batch.query_lens), **kwargs)


def _run(kernel: Callable[..., None], batch: PagedBatch, scale: float, **kwargs) -> torch.Tensor:
    out = torch.full_like(batch.query, float("nan"))
    kernel(
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.seq_lens,
        batch.query_start_loc,
        out,
        scale,
        **kwargs,
    )
    return out
