"""int8 KV: a quarter of float32's bytes per token, dequantized where it is read.

Layout: per layer K and V are int8 tensors [num_blocks, block_size, kv_heads, head_dim + 4]. Each
(slot, head) row holds its head_dim values as int8 and then its scale as a float32 in the last 4
bytes: value = int8 * scale, scale = max|x| / 127 of the row, rounded to nearest (ties to even).
So the tensors flow through every interface as plain tensors, copy-on-write and the shared-memory
segment see ordinary bytes, and a block carries its own scales (per slot and head).

Why a scale per row, not one per block and head: tokens arrive one at a time, and a block's later
token may exceed the range its earlier tokens set. One scale per block would then clip the new
token or rewrite the block's committed rows under a new scale (rounding them twice, and a worker
killed mid-rewrite would corrupt KV that counts as committed, see docs/kv-persistence.md). A row
written once, with its token, has neither problem; its scale costs 4 bytes per 64 values
(float32 KV: 256 bytes), 3.76x the tokens per byte of float32 KV.

`Int8KVBackend` wraps the float backend a worker runs: on the CPU with our C++ kernels it writes and
reads int8 in place, under each layer's rules (kernels/cpu/kv_int8.cpp, every ISA path); anywhere
else, and as the reference the kernel is tested against, it dequantizes the blocks a step reads and runs the float backend on
them (`torch` semantics exactly, including any per-layer rules it takes).
"""

from __future__ import annotations

import dataclasses

import torch

from pagedserve.kernels.attention import CAUSAL, AttentionBackend, AttentionMetadata, AttentionRules

SCALE_BYTES = 4  # a float32 per (slot, head) row


def row_dim(head_dim: int) -> int:
    """The last dimension of an int8 cache: the values, then the scale's 4 bytes."""
    return head_dim + SCALE_BYTES


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., D] float -> [..., D + 4] int8 rows (values, then the float32 scale's bytes)."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True).double()
    # Divisions in float64, rounded once to float32, here and in the C++ write: torch's vectorized
    # float32 division is not always correctly rounded, and both sides must give the same bytes.
    scale = (amax / 127.0).float()
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax)).float()
    values = torch.round(x * inv).clamp_(-127, 127).to(torch.int8)
    return torch.cat([values, scale.contiguous().view(torch.int8)], dim=-1)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[..., D + 4] int8 rows -> [..., D] values in `dtype`."""
    values, scale = rows[..., :-SCALE_BYTES], rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)
    return (values.float() * scale).to(dtype)


class Int8KVBackend(AttentionBackend):
    def __init__(self, inner: AttentionBackend) -> None:
        """`inner`: the float backend; its C++ int8 ops are used when it is the C++ one."""
        self.inner = inner
        self.name = inner.name
        self.ops = None
        if inner.name == "cpp":
            from pagedserve.kernels.cpu.backend import run_paged_op
            from pagedserve.kernels.cpu.build import KV_INT8, KernelBuildError, load_extension
            from pagedserve.kernels.cpu.dispatch import try_load_ops

            self._run_paged_op = run_paged_op  # imported here: the C++ package only where it runs

            isa = getattr(inner, "isa", None)
            try:
                self.ops = try_load_ops(KV_INT8) if isa is None else load_extension(KV_INT8, isa)
            except KernelBuildError:
                self.ops = None  # the reference runs: slower, same results

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        if self.ops is not None and key.device.type == "cpu" and key.dtype in (torch.float32, torch.bfloat16):
            self.ops.write_kv_int8(key, value, k_cache, v_cache, slot_mapping)
            return
        rows = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, *rows)[slot_mapping] = quantize_rows(key)
        v_cache.view(-1, *rows)[slot_mapping] = quantize_rows(value)

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        rules: AttentionRules = CAUSAL,
    ) -> torch.Tensor:
        """`rules`: a layer's extra attention rules (a sliding window, a softcap), applied by the C++
        int8 kernel itself and by the float backend under the reference."""
        if self.ops is not None and query.device.type == "cpu":
            return self._run_paged_op(
                self.ops.paged_attention_int8, query, k_cache, v_cache, meta, scale, rules
            )
        return self.reference(query, k_cache, v_cache, meta, scale, rules)

    def reference(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        rules: AttentionRules = CAUSAL,
    ) -> torch.Tensor:
        """Dequantize the blocks this step reads (not the pool) and run the float backend on them."""
        used, tables = torch.unique(meta.block_tables, return_inverse=True)
        k = dequantize_rows(k_cache[used], query.dtype)
        v = dequantize_rows(v_cache[used], query.dtype)
        local = dataclasses.replace(meta, block_tables=tables.to(meta.block_tables.dtype).contiguous())
        return self.inner.forward(query, k, v, local, scale, rules)
