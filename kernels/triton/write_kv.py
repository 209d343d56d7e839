"""Store this step's K/V rows into the paged cache at their slots (block_id * block_size + offset)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    # One program per token: all its KV heads at once, so every row is one contiguous store.
    t = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + t)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    # A negative slot marks a padding token (e.g. CUDA-graph padding): it has no place in the cache.
    # Folded into the head bound because the interpreter rejects a scalar-and-tensor mask.
    num_heads = tl.where(slot >= 0, NUM_KV_HEADS, 0)
    mask = (h[:, None] < num_heads) & (d[None, :] < HEAD_DIM)
    page = slot // PAGE_SIZE
    offset = slot % PAGE_SIZE
    k = tl.load(key_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(value_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    # slot is int64, so page * stride cannot wrap even for caches past 2**31 elements.
    k_dst = k_cache_ptr + page * stride_kcb + offset * stride_kcs + h[:, None] * stride_kch + d[None, :]
    v_dst = v_cache_ptr + page * stride_vcb + offset * stride_vcs + h[:, None] * stride_vch + d[None, :]
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value [T, kv_heads, D] -> caches [num_blocks, block_size, kv_heads, D] at slot_mapping [T]."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    # The kernel assumes unit stride along head_dim (the innermost, contiguous axis of every layout).
    for name, t in (("key", key), ("value", value), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along head_dim; got strides {t.stride()}")
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping.to(torch.int64),
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        # triton's stubs type a tl.constexpr parameter as tl.constexpr; a launch passes plain values
        NUM_KV_HEADS=num_kv_heads,  # pyright: ignore[reportArgumentType]
        HEAD_DIM=head_dim,  # pyright: ignore[reportArgumentType]
        BLOCK_H=triton.next_power_of_2(num_kv_heads),  # pyright: ignore[reportArgumentType]
        BLOCK_D=triton.next_power_of_2(head_dim),  # pyright: ignore[reportArgumentType]
        PAGE_SIZE=k_cache.shape[1],  # pyright: ignore[reportArgumentType]
    )
