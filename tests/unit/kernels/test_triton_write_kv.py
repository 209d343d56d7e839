"""write_kv: every new K/V row lands at its slot; nothing else in the cache changes."""

from __future__ import annotations

import torch
import triton_env  # noqa: F401  (before any kernels import: selects the Triton interpreter)
from hypothesis import given, settings
from hypothesis import strategies as st
from triton_env import DEVICE, max_examples

from pagedserve.kernels.triton.write_kv import write_kv

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@settings(max_examples=max_examples(25), deadline=None)
@given(
    num_tokens=st.integers(1, 40),
    num_kv_heads=st.sampled_from([1, 2, 3, 8]),
    head_dim=st.sampled_from([64, 128, 80, 96]),
    block_size=st.sampled_from([8, 16, 32, 64, 128]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_rows_land_at_their_slots_and_nowhere_else(
    num_tokens: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_blocks = -(-num_tokens // block_size) + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_k.view(-1, num_kv_heads, head_dim)[slots] = key
    want_v.view(-1, num_kv_heads, head_dim)[slots] = value

    k_dev, v_dev = k_cache.to(DEVICE), v_cache.to(DEVICE)
    write_kv(key.to(DEVICE), value.to(DEVICE), k_dev, v_dev, slots.to(DEVICE))

    assert torch.equal(k_dev.cpu(), want_k)
    assert torch.equal(v_dev.cpu(), want_v)


def test_negative_slot_is_padding_and_writes_nothing() -> None:
    key = torch.ones(3, 2, 64)
    value = torch.full((3, 2, 64), 2.0)
    k_cache = torch.zeros(2, 16, 2, 64, device=DEVICE)
    v_cache = torch.zeros(2, 16, 2, 64, device=DEVICE)
    slots = torch.tensor([5, -1, 17])

    write_kv(key.to(DEVICE), value.to(DEVICE), k_cache, v_cache, slots.to(DEVICE))

    written = k_cache.view(-1, 2, 64).abs().sum(dim=(1, 2)).nonzero().flatten().cpu()
    assert written.tolist() == [5, 17]
    assert torch.equal(v_cache.view(-1, 2, 64)[17].cpu(), value[2])


def test_key_view_with_strided_token_axis_is_written() -> None:
    # The model hands K as a slice of a fused QKV projection: rows are not contiguous.
    qkv = torch.randn(4, 3, 2, 64)
    key, value = qkv[:, 1], qkv[:, 2]
    k_cache = torch.zeros(1, 8, 2, 64, device=DEVICE)
    v_cache = torch.zeros(1, 8, 2, 64, device=DEVICE)

    write_kv(key.to(DEVICE), value.to(DEVICE), k_cache, v_cache, torch.tensor([7, 0, 3, 1], device=DEVICE))

    assert torch.equal(k_cache[0, [7, 0, 3, 1]].cpu(), key)
    assert torch.equal(v_cache[0, [7, 0, 3, 1]].cpu(), value)
