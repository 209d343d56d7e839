"""The float32 few-rows linear (kernels/cpu/linear.cpp) against F.linear, on every ISA path this CPU runs.

Sums run in another order than MKL's sgemm, so outputs agree to float32 rounding (a few ulp of the
largest partial sum), not bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from pagedserve.kernels.cpu.build import LINEAR, load_extension
from pagedserve.kernels.cpu.isa import ISAS, missing_flags, runnable_isas
from pagedserve.services.worker.models.packed_linear import RowsLinear


def _op(isa: str):
    if isa not in runnable_isas():
        pytest.skip(f"this CPU cannot run the {isa} path: it lacks {', '.join(missing_flags(isa))}")
    return load_extension(LINEAR, isa).linear_rows


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 13),
    in_features=st.one_of(st.integers(1, 40), st.sampled_from([64, 576, 1536])),
    out_features=st.one_of(st.integers(1, 21), st.sampled_from([64, 960, 3072])),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rows_linear_equals_f_linear_for_any_shape(isa, rows, in_features, out_features, bias, seed):
    op = _op(isa)
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen)
    b = torch.randn(out_features, generator=gen) if bias else None
    x = torch.randn(rows, in_features, generator=gen)
    torch.testing.assert_close(
        op(x, weight, b), F.linear(x, weight, b), rtol=1e-5, atol=1e-5 * in_features**0.5
    )


@pytest.mark.parametrize("isa", ISAS)
def test_rows_linear_reads_rows_at_a_stride(isa):
    op = _op(isa)
    weight, wide = torch.randn(7, 33), torch.randn(5, 50)
    x = wide[:, 3:36]  # rows 50 floats apart, each contiguous
    torch.testing.assert_close(op(x, weight, None), F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_rows_linear_refuses_what_it_cannot_read():
    op = _op(runnable_isas()[0])
    with pytest.raises(RuntimeError, match="float32"):
        op(torch.randn(2, 8).bfloat16(), torch.randn(4, 8).bfloat16(), None)
    with pytest.raises(RuntimeError, match=r"x \[M, K\] and weight \[N, K\]"):
        op(torch.randn(2, 8), torch.randn(4, 9), None)


def test_more_rows_than_the_kernel_takes_go_to_f_linear():
    op = load_extension(LINEAR, runnable_isas()[0]).linear_rows.default
    weight = torch.randn(16, 32)
    layer = RowsLinear(weight, None, op, max_rows=4)
    for rows in (1, 4, 5, 64):
        x = torch.randn(rows, 32)
        expected = F.linear(x, weight)
        got = layer(x)
        if rows > 4:
            assert torch.equal(got, expected)  # F.linear itself
        else:
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
