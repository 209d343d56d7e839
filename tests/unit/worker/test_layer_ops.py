"""The per-layer small ops written with fewer calls give the very same bits as the plain forms."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.kernels.layer_ops import apply_rotary_
from pagedserve.services.worker.layers.norm import RMSNorm
from pagedserve.services.worker.layers.rope import apply_rotary


def _reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's LlamaRMSNorm, op for op."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 300),
    dim=st.sampled_from([16, 64, 128, 576, 960, 2048]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_rms_norm_is_bit_identical_to_the_reference(rows, dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    norm = RMSNorm(dim, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(dim, generator=gen))
    norm = norm.to(dtype)
    x = (torch.randn(rows, dim, generator=gen) * 3).to(dtype)
    assert torch.equal(norm(x), _reference_rms_norm(x, norm.weight, 1e-5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("tokens", "q_heads", "kv_heads", "head_dim"), [(1, 9, 3, 64), (37, 4, 2, 16), (5, 2, 2, 128)]
)
def test_in_place_rotary_of_q_and_k_together_matches_rotating_each(
    dtype, tokens, q_heads, kv_heads, head_dim
):
    gen = torch.Generator().manual_seed(tokens)
    q_size, kv_size = q_heads * head_dim, kv_heads * head_dim
    qkv = torch.randn(tokens, q_size + 2 * kv_size, generator=gen).to(dtype)
    freqs = torch.rand(tokens, head_dim // 2, generator=gen) * 50
    cos, sin = freqs.cos().to(dtype)[:, None, :], freqs.sin().to(dtype)[:, None, :]
    q = qkv[:, :q_size].reshape(tokens, q_heads, head_dim)
    k = qkv[:, q_size : q_size + kv_size].reshape(tokens, kv_heads, head_dim)
    expected_q, expected_k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    v_before = qkv[:, q_size + kv_size :].clone()

    qk = qkv[:, : q_size + kv_size].view(tokens, q_heads + kv_heads, head_dim)
    assert apply_rotary_(qk, cos, sin) is qk
    assert torch.equal(qkv[:, :q_size].view(tokens, q_heads, head_dim), expected_q)
    assert torch.equal(qkv[:, q_size : q_size + kv_size].view(tokens, kv_heads, head_dim), expected_k)
    assert torch.equal(qkv[:, q_size + kv_size :], v_before)  # v untouched
