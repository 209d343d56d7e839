"""The fused C++ layer ops (kernels/cpu/layer_ops.cpp) against the plain torch forms, their reference,
on every ISA path this CPU runs (avx512, avx2, portable: one source, built once per path).

Any row count (1 included), any row length (odd ones take the masked tail), float32 and bfloat16.
What may differ, and by how much: the sum of squares adds in another order than torch's sum kernel,
so a float32 norm may be a few ulp off, and where that moves a bfloat16 value across a rounding
boundary it comes out a bf16 ulp or two off. SiLU's exp: on avx512 and avx2 torch's own vector exp
(Sleef, u10: within 1 ulp), the one torch's silu uses for whole vectors, but torch computes a row's
tail with libm's expf; the portable path takes libm's expf for every lane, so its float32 SiLU may
be an ulp or so off torch's vector exp almost anywhere: ~1e-7 relative, well inside rtol 1e-6, and
in bfloat16 it rarely crosses a rounding boundary (the 2% bound below). Everything else is exact:
the residual sum, and the rotary embedding (every product and sum rounded where apply_rotary_'s ops
round them). One known exception the inputs here never hit: with AVX512-BF16, rounding to bfloat16
flushes float32 denormals (< 1.2e-38) to zero.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.kernels.layer_ops import TORCH_LAYER_OPS, CppLayerOps
from pagedserve.services.worker.layers.rope import apply_rotary


@pytest.fixture(scope="module")
def cpp(isa: str) -> CppLayerOps:
    """Each path this CPU can execute (the `isa` fixture), built and loaded."""
    ops = CppLayerOps(isa)
    assert ops.isa == isa
    return ops


DTYPES = [torch.float32, torch.bfloat16]
# (rtol, atol): a few float32 ulp; two bfloat16 ulp (a normalised value one ulp off, then rounded
# again after the weight's multiply).
TOLERANCE = {torch.float32: (1e-6, 1e-6), torch.bfloat16: (2**-6, 1e-6)}
SHAPES = st.tuples(
    st.integers(1, 130), st.one_of(st.integers(1, 70), st.sampled_from([576, 960, 1536, 2049]))
)


def _assert_close(ours: torch.Tensor, reference: torch.Tensor) -> None:
    assert ours.dtype == reference.dtype and ours.shape == reference.shape
    rtol, atol = TOLERANCE[ours.dtype]
    torch.testing.assert_close(ours, reference, rtol=rtol, atol=atol)
    if ours.dtype == torch.bfloat16:  # a bf16 value one ulp off is the exception, not the rule
        assert (ours != reference).float().mean().item() <= 0.02


def _inputs(rows: int, dim: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, dim, generator=gen) * 3).to(dtype)
    residual = torch.randn(rows, dim, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(dim, generator=gen)).to(dtype)
    return x, residual, weight


@settings(max_examples=60, deadline=None)
@given(shape=SHAPES, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_rms_norm_matches_the_torch_form(cpp, shape, dtype, seed):
    x, _, weight = _inputs(*shape, dtype, seed)
    _assert_close(cpp.rms_norm(x, weight, 1e-5), TORCH_LAYER_OPS.rms_norm(x, weight, 1e-5))


@settings(max_examples=60, deadline=None)
@given(shape=SHAPES, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_fused_add_rms_norm_sums_exactly_and_normalises_in_place(cpp, shape, dtype, seed):
    x, residual, weight = _inputs(*shape, dtype, seed)
    expected_out, expected_sum = TORCH_LAYER_OPS.add_rms_norm(x, residual, weight, 1e-6)

    out, new_residual = cpp.add_rms_norm(x, residual, weight, 1e-6)
    assert out is x and new_residual is residual  # in place, no new tensors
    assert torch.equal(residual, expected_sum)
    _assert_close(x, expected_out)


@settings(max_examples=60, deadline=None)
@given(shape=SHAPES, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_silu_and_mul_matches_the_torch_form(cpp, shape, dtype, seed):
    rows, inter = shape
    gen = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(rows, 2 * inter, generator=gen) * 4).to(dtype)
    _assert_close(cpp.silu_and_mul(gate_up), TORCH_LAYER_OPS.silu_and_mul(gate_up))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_is_exact_at_the_extremes(cpp, dtype):
    # exp(-g) overflows for very negative g: silu is -0, not NaN; large positive g passes through.
    gate = torch.tensor([[-200.0, -88.0, -20.0, 0.0, 20.0, 88.0, 200.0]]).to(dtype)
    gate_up = torch.cat([gate, torch.ones_like(gate)], dim=1)
    ours = cpp.silu_and_mul(gate_up)
    assert not ours.isnan().any()
    _assert_close(ours, TORCH_LAYER_OPS.silu_and_mul(gate_up))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_reads_heads_inside_the_fused_qkv_output(cpp, dtype):
    # Qwen3's q_norm / k_norm: per-head norms over a strided view of the q/k/v projection.
    tokens, heads, kv_heads, head_dim = 5, 4, 2, 32
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
    q = qkv.view(tokens, -1, head_dim)[:, heads : heads + kv_heads]  # the k heads: not contiguous
    weight = (1 + 0.1 * torch.randn(head_dim)).to(dtype)
    ours = cpp.rms_norm(q, weight, 1e-6)
    assert ours.is_contiguous()
    _assert_close(ours, TORCH_LAYER_OPS.rms_norm(q, weight, 1e-6))


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(1, 80),
    q_heads=st.integers(1, 9),
    kv_heads=st.integers(1, 3),
    head_dim=st.sampled_from([2, 6, 16, 34, 64, 128]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_rotary_of_q_and_k_in_the_qkv_output_gives_the_very_bits_of_the_torch_form(
    cpp, tokens, q_heads, kv_heads, head_dim, dtype, seed
):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    freqs = torch.rand(tokens, head_dim // 2, generator=gen) * 50
    cos, sin = freqs.cos().to(dtype)[:, None, :], freqs.sin().to(dtype)[:, None, :]
    expected = qkv.clone()
    TORCH_LAYER_OPS.rotary_(expected.view(tokens, -1, head_dim)[:, : q_heads + kv_heads], cos, sin)

    qk = qkv.view(tokens, -1, head_dim)[:, : q_heads + kv_heads]
    assert cpp.rotary_(qk, cos, sin) is qk
    assert torch.equal(qkv, expected)  # q and k rotated, v untouched


def test_rotary_in_place_matches_the_copying_form(cpp):
    x = torch.randn(3, 4, 64)
    freqs = torch.rand(3, 32) * 50
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
    expected = apply_rotary(x, cos, sin)
    assert torch.equal(cpp.rotary_(x, cos, sin), expected)


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(0, 40),
    experts=st.sampled_from([3, 7, 32, 60]),
    data=st.data(),
    dtype=st.sampled_from(DTYPES),
    normalize=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_moe_route_gives_the_very_bits_of_the_torch_form(cpp, tokens, experts, data, dtype, normalize, seed):
    # The same torch ops, called from C++: ids and weights equal bit for bit, ties included.
    top_k = data.draw(st.integers(1, experts))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 48, generator=gen).to(dtype)
    router = (0.2 * torch.randn(experts, 48, generator=gen)).to(dtype)
    if tokens > 1:
        x[1] = x[0]  # two tokens routed alike
    ids, weights = cpp.moe_route(x, router, top_k, normalize)
    want_ids, want_weights = TORCH_LAYER_OPS.moe_route(x, router, top_k, normalize)
    assert ids.dtype == torch.int64 and weights.dtype == dtype
    assert torch.equal(ids, want_ids) and torch.equal(weights, want_weights)


def test_moe_route_refuses_a_top_k_beyond_the_experts(cpp):
    with pytest.raises(RuntimeError, match=r"top_k must be in \[1, 4\], got 5"):
        cpp.moe_route(torch.randn(2, 8), torch.randn(4, 8), 5, True)


def test_rotary_refuses_cos_of_the_wrong_shape(cpp):
    x, cos = torch.randn(3, 4, 64), torch.randn(3, 1, 16)
    with pytest.raises(RuntimeError, match=r"cos and sin must be \[tokens, 1, head_dim / 2\] = \[3, 1, 32\]"):
        cpp.rotary_(x, cos, cos)


def test_an_unsupported_dtype_is_refused_by_name(cpp):
    x = torch.randn(2, 8, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        cpp.rms_norm(x, torch.ones(8, dtype=torch.float16), 1e-6)


def test_a_weight_of_the_wrong_length_is_refused(cpp):
    with pytest.raises(RuntimeError, match=r"weight must be contiguous \[8\]"):
        cpp.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-6)


def test_no_rows_is_no_work(cpp):
    x, residual = torch.empty(0, 64), torch.empty(0, 64)
    assert cpp.rms_norm(x, torch.ones(64), 1e-6).shape == (0, 64)
    cpp.add_rms_norm(x, residual, torch.ones(64), 1e-6)
    assert cpp.silu_and_mul(torch.empty(0, 128)).shape == (0, 64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_nan_stays_a_nan_through_every_rounding(cpp, dtype):
    # Round to bfloat16 keeps NaN a NaN on every path (its bits differ: 0x7FC0 or 0xFFFF), in a whole
    # vector and in a tail alike; the other rows are untouched by it.
    x = torch.randn(3, 37).to(dtype)
    x[1, 2] = x[2, 35] = float("nan")
    weight = torch.ones(37, dtype=dtype)
    out = cpp.rms_norm(x, weight, 1e-6)
    assert out[1:].isnan().all() and not out[0].isnan().any()
    gate_up = torch.ones(2, 2 * 37, dtype=dtype)
    gate_up[0, [0, 36]] = float("nan")
    silu = cpp.silu_and_mul(gate_up)
    assert silu[0, [0, 36]].isnan().all() and silu.isnan().sum() == 2
