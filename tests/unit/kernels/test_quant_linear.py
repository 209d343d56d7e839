"""The GGUF quantized-linear kernel on every ISA path this CPU runs, against the dequantize-then-float32
reference: the `gguf` package's own dequantizer (an independent reading of the formats), then a float32
matmul.

Tolerance: the kernel and the reference compute the same sum of K products in float32 in different
orders, so they differ by rounding; each output is held to 1e-5 of the sum of the magnitudes of its
products (|x| @ |W|^T), which bounds that rounding for K up to several thousand (K * 2^-24 ~ 3e-5 at
K = 512 in the worst case, far less on average). Embedding rows are decoded exactly (one multiply of
fp16 scale by a small integer code, exact in float32, and one add).
"""

from __future__ import annotations

from typing import Any

import gguf
import numpy as np
import pytest
import torch
from harness.gguf_models import quantize
from pagedserve.kernels.cpu.build import QUANT_LINEAR, load_extension

TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12}


@pytest.fixture(scope="module")
def ops(isa: str) -> Any:
    """Each path this CPU runs (the `isa` fixture); a runnable path that does not build fails."""
    return load_extension(QUANT_LINEAR, isa)


def weights(type_name: str, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (blocks, the gguf package's dequantization of them)."""
    rng = np.random.default_rng(seed)
    dense = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
    blocks, _ = quantize(dense, type_name)
    reference = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[type_name]).astype(np.float32)
    return torch.from_numpy(blocks), torch.from_numpy(reference)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13, 64])
def test_linear_matches_the_dequantized_float32_reference(ops: Any, type_name: str, rows: int) -> None:
    n, k = 37, 512  # an odd number of outputs: the kernel's one-row tail
    blocks, reference = weights(type_name, n, k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    bias = torch.randn(n)
    out = ops.quant_linear(x, blocks, TYPES[type_name], bias)
    expected = x @ reference.T + bias
    bound = 1e-5 * (x.abs() @ reference.abs().T + bias.abs())
    assert out.shape == (rows, n) and out.dtype == torch.float32
    assert ((out - expected).abs() <= bound).all(), (out - expected).abs().max()


@pytest.mark.parametrize("type_name", TYPES)
def test_embedding_rows_decode_exactly(ops: Any, type_name: str) -> None:
    blocks, reference = weights(type_name, 50, 256, seed=1)
    ids = torch.tensor([0, 7, 49, 7])
    assert torch.equal(ops.quant_rows(blocks, TYPES[type_name], ids, 256), reference[ids])


def test_no_rows_and_non_contiguous_input(ops: Any) -> None:
    blocks, reference = weights("Q4_1", 8, 64)
    assert ops.quant_linear(torch.empty(0, 64), blocks, 3, None).shape == (0, 8)
    x = torch.randn(64, 3).T  # a transposed view: the kernel reads its own contiguous copy
    assert torch.allclose(ops.quant_linear(x, blocks, 3, None), x @ reference.T, atol=1e-4)


def test_bad_weights_are_refused_with_the_reason(ops: Any) -> None:
    blocks, _ = weights("Q4_1", 8, 64)
    with pytest.raises(RuntimeError, match="GGML type 14 is not supported"):
        ops.quant_linear(torch.randn(1, 64), blocks, 14, None)
    with pytest.raises(RuntimeError, match="a row of 64 weights of type 8 is 68 bytes, qweight has 40"):
        ops.quant_linear(torch.randn(1, 64), blocks, 8, None)
    with pytest.raises(RuntimeError, match="not a multiple of 256"):
        ops.quant_linear(torch.randn(1, 64), blocks, 12, None)
    with pytest.raises(RuntimeError, match="id 8 is outside"):
        ops.quant_rows(blocks, 3, torch.tensor([8]), 64)
