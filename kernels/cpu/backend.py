"""Paged attention with our C++ CPU kernel (kernels/cpu/paged_attention.cpp): the default on the CPU.

Reads K/V in place from the paged cache, block by block; the torch backend
gathers each row's whole context into a padded copy per layer first, which was ~half of attention's
time. K/V writes are one C++ copy per token row too (the torch backend's indexed assignment is two
index_put_ dispatches per layer). The torch backend stays the oracle: tests compare the two on
random shapes, block sizes and dtypes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pagedserve.kernels.attention import CAUSAL, AttentionMetadata, AttentionRules
from pagedserve.kernels.cpu.build import PAGED_ATTENTION, load_extension
from pagedserve.kernels.cpu.dispatch import kernel_paths, load_ops
from pagedserve.kernels.torch_backend import TorchAttentionBackend

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


class CppAttentionBackend(TorchAttentionBackend):
    name = "cpp"

    def __init__(self, isa: str | None = None) -> None:
        """The best ISA path this CPU runs (or the one PAGEDSERVE_CPU_ISA forces), or exactly `isa`
        (tests hold each path to the torch backend). Builds on first use; KernelBuildError if this
        machine cannot."""
        ops = load_ops(PAGED_ATTENTION) if isa is None else load_extension(PAGED_ATTENTION, isa)
        self.isa = isa or kernel_paths()[PAGED_ATTENTION.name]
        self._op = ops.paged_attention
        self._write_kv = ops.write_kv

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        if key.device.type != "cpu" or key.dtype not in SUPPORTED_DTYPES or slot_mapping.dtype != torch.int64:
            return super().write_kv(key, value, k_cache, v_cache, slot_mapping)
        self._write_kv(key, value, k_cache, v_cache, slot_mapping)

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        rules: AttentionRules = CAUSAL,
    ) -> torch.Tensor:
        if query.device.type != "cpu" or query.dtype not in SUPPORTED_DTYPES:
            return super().forward(query, k_cache, v_cache, meta, scale, rules)
        return run_paged_op(self._op, query, k_cache, v_cache, meta, scale, rules)


def run_paged_op(
    op: Callable[..., None],
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    rules: AttentionRules,
) -> torch.Tensor:
    """One call of a C++ paged-attention op (float or int8 KV: the same argument list) into a new
    output. The kernels read q in place from the fused q/k/v output (tokens strided, heads packed)."""
    if query.stride(2) != 1 or query.stride(1) != query.shape[2]:
        query = query.contiguous()
    out = torch.empty(query.shape, dtype=query.dtype)
    op(
        query,
        k_cache,
        v_cache,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables,
        scale,
        rules.window or 0,  # the kernels' "none" is 0 for both
        rules.softcap or 0.0,
        out,
    )
    return out
