"""The GGUF quantized-linear kernel, every type on every ISA path this CPU runs, against the
dequantize-then-float32 reference: the `gguf` package's own dequantizer (an independent reading of the
formats), then a float32 matmul.

Tolerance, float32 activations (mode 0, the default): the kernel
and the reference compute the same sum of K products in float32 in different orders, so they differ
by rounding; each output is held to 1e-5 of the sum of the magnitudes of its products (|x| @ |W|^T),
which bounds that rounding for K up to several thousand (K * 2^-24 ~ 3e-5 at K = 512 in the worst
case, far less on average). Embedding rows are decoded exactly (one multiply of a scale by a small
integer code, exact in float32, and one add: the dequantizer's arithmetic).

Tolerance, int8 activations (modes 1-3; llama.cpp
quantizes activations the same way): each 32-element block of a row becomes q = round(x * 127 / m),
m = max|x| over the block, so each x moves by at most half a step, m / 254. An output then moves by at
most sum over blocks of (m_block / 254) * sum |w| over the block: (blockmax(|x|) / 254) @ |W|^T, about
1/127 of the block max per block (the same rounding bound as above added, and 0.1% on the step for the
float rounding of the scale and its reciprocal). The integer dot products themselves are exact.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from harness.gguf_models import quantize

from pagedserve.kernels.cpu.build import QUANT_LINEAR, load_extension
from pagedserve.services.worker.layers.quant_linear import KERNEL_TYPES

TYPES = KERNEL_TYPES  # every type the kernel runs: F16, BF16, Q4_0 ... Q6_K, IQ4_NL, IQ4_XS
INTEGER_TYPES = [t for t in TYPES if t not in ("F16", "BF16")]  # the int8-activation path's
FLOAT, INT_BELOW_PANELS, INT, INT_NO_VNNI, TILES, PANELS = 0, 1, 2, 3, 4, 5  # quant_linear's mode
PANEL_ROWS = 24  # quant_linear.cpp's kPanelRows: from this many rows mode 0 decodes panels for a GEMM


@pytest.fixture(scope="module")
def ops(isa: str) -> Any:
    """Each path this CPU runs (the `isa` fixture); a runnable path that does not build fails."""
    return load_extension(QUANT_LINEAR, isa)


@cache
def weights(type_name: str, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (blocks, the gguf package's dequantization of them). Rows of different magnitudes and a zero
    row, so that the scales differ from row to row and an all-zero block is read too."""
    rng = np.random.default_rng(seed)
    dense = (rng.standard_normal((n, k)) * rng.uniform(0.02, 0.2, (n, 1))).astype(np.float32)
    dense[n // 2] = 0.0
    blocks, _ = quantize(dense, type_name)
    reference = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[type_name]).astype(np.float32)
    return torch.from_numpy(blocks), torch.from_numpy(reference.reshape(n, k))


def within_float_rounding(out: torch.Tensor, x: torch.Tensor, reference: torch.Tensor, bias) -> None:
    expected = x @ reference.T + (0 if bias is None else bias)
    bound = 1e-5 * (x.abs() @ reference.abs().T + (0 if bias is None else bias.abs()))
    assert out.shape == expected.shape and out.dtype == torch.float32
    err = (out - expected).abs()
    assert (err <= bound).all(), f"{len(x)} rows: worst error {(err / bound).max():.2f}x the bound"


def blockmax(x: torch.Tensor) -> torch.Tensor:
    """Each element's 32-block max |x|, the scale its int8 quantization is relative to."""
    rows, k = x.shape
    return x.abs().view(rows, k // 32, 32).amax(-1, keepdim=True).expand(rows, k // 32, 32).reshape(rows, k)


def within_int8_bound(out: torch.Tensor, x: torch.Tensor, reference: torch.Tensor, bias, where) -> None:
    """The int8-activation bound of the module docstring, and proof it is not vacuous: the error is also
    well under 1% of the products' magnitude."""
    expected = x @ reference.T + bias
    magnitude = x.abs() @ reference.abs().T + bias.abs()
    bound = (blockmax(x) / 254 * 1.001) @ reference.abs().T + 1e-5 * magnitude
    err = (out - expected).abs()
    assert (err <= bound).all(), (*where, (err / bound).max())
    assert (err <= 0.01 * magnitude).all(), where


def int8_inputs(rows: int, k: int) -> torch.Tensor:
    """Activations of uneven magnitude per column, with an all-zero first block (scale 0, codes 0)."""
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)) * torch.rand(k) * 3
    x[0, :32] = 0.0
    return x


@pytest.mark.parametrize("type_name", TYPES)
def test_linear_matches_the_dequantized_float32_reference(ops: Any, type_name: str) -> None:
    n, k = 37, 512  # an odd number of outputs: the kernel's one-row tail
    blocks, reference = weights(type_name, n, k)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(0))
    for rows in (1, 2, 3, 4, 5, 8, 13, 64):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        within_float_rounding(ops.quant_linear(x, blocks, TYPES[type_name], bias, FLOAT), x, reference, bias)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("mode", [TILES, PANELS], ids=["tiles", "panels"])
def test_both_float_paths_match_the_reference_at_any_row_count(ops: Any, type_name: str, mode: int) -> None:
    """Mode 0 picks the tiles below PANEL_ROWS and the panels from there; each is held to the same float
    rounding bound at every row count, so the switch is a matter of speed only."""
    blocks, reference = weights(type_name, 37, 768, seed=1)
    for rows in (1, 5, PANEL_ROWS, 40):
        x = torch.randn(rows, 768, generator=torch.Generator().manual_seed(rows))
        for bias in (torch.randn(37), None):
            within_float_rounding(
                ops.quant_linear(x, blocks, TYPES[type_name], bias, mode), x, reference, bias
            )


@pytest.mark.parametrize("mode", [TILES, INT, INT_NO_VNNI], ids=["tiles", "int", "int-novnni"])
@pytest.mark.parametrize(
    "type_name", ["Q4_1", "Q4_0", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "BF16"]
)
def test_a_tile_row_scores_as_it_would_alone(ops: Any, type_name: str, mode: int) -> None:
    """Below the panel threshold (float) or at any row count (int8 activations) each row's sum runs
    in one order whatever the row count, so the k + 1 rows a speculative verify step scores give bit
    for bit what k + 1 one-row decodes would: greedy acceptance cannot flip on rounding."""
    blocks, _ = weights(type_name, 37, 512, seed=2)
    x = torch.randn(PANEL_ROWS - 1, 512, generator=torch.Generator().manual_seed(7))
    together = ops.quant_linear(x, blocks, TYPES[type_name], None, mode)
    for i in range(len(x)):
        assert torch.equal(
            together[i], ops.quant_linear(x[i : i + 1], blocks, TYPES[type_name], None, mode)[0]
        )


def test_panels_cover_outputs_past_the_first_panel(ops: Any) -> None:
    # A panel is 4 MiB of float32 rows: 2048 rows of K = 512, so 2100 outputs take a second, partial one.
    n, k = 2100, 512
    blocks, reference = weights("Q4_1", n, k)
    x = torch.randn(PANEL_ROWS + 3, k, generator=torch.Generator().manual_seed(1))
    for bias in (torch.randn(n), None):
        within_float_rounding(ops.quant_linear(x, blocks, TYPES["Q4_1"], bias, FLOAT), x, reference, bias)


def test_mode_0_switches_to_panels_at_the_threshold(ops: Any) -> None:
    blocks, _ = weights("Q4_0", 40, 256)
    x = torch.randn(PANEL_ROWS, 256, generator=torch.Generator().manual_seed(2))
    below, at = x[: PANEL_ROWS - 1], x
    assert torch.equal(
        ops.quant_linear(below, blocks, 2, None), ops.quant_linear(below, blocks, 2, None, TILES)
    )
    panels = ops.quant_linear(at, blocks, 2, None, PANELS)
    assert torch.equal(ops.quant_linear(at, blocks, 2, None), panels)
    assert not torch.equal(ops.quant_linear(at, blocks, 2, None, TILES), panels)  # their sums' orders differ


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_many_rows_score_as_each_row_alone(ops: Any, type_name: str) -> None:
    """From 16 rows the avx2 path decodes Q4_0/Q4_1 weights into panels of outputs once and walks the
    rows over them in blocks (quant_int8.cpp's pair_impl); each row still sums in the one-row path's
    order, bit for bit: across panels (a partial last one), row blocks, 8-row tails and an odd last group."""
    kind = TYPES[type_name]
    # (outputs, in features, rows): 512 wide, panels of 8 outputs (the last one partial) and a row-block
    # edge at 128 rows; 2048 wide, panels of 2 outputs and blocks of 32 rows; 96 wide, 3 groups (the
    # last one unpaired).
    for n, k, rows in [(37, 512, 16), (37, 512, 137), (5, 96, 29), (19, 2048, 40)]:
        blocks, _ = weights(type_name, n, k, seed=3)
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        bias = torch.randn(n, generator=torch.Generator().manual_seed(n))
        together = ops.quant_linear(x, blocks, kind, bias, INT)
        alone = torch.cat([ops.quant_linear(x[i : i + 1], blocks, kind, bias, INT) for i in range(rows)])
        assert torch.equal(together, alone), (n, k, rows)


@pytest.mark.parametrize(
    "mode", [INT, INT_NO_VNNI, INT_BELOW_PANELS], ids=["int", "int-novnni", "int-mode-1"]
)
@pytest.mark.parametrize("type_name", INTEGER_TYPES)
def test_int8_activations_stay_within_the_quantization_bound(ops: Any, mode: int, type_name: str) -> None:
    superblock = gguf.constants.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][0] == 256
    for rows, k in [(1, 512), (3, 512), (8, 512), (13, 512), (64, 512), (9, 96), (16, 1024)]:
        if superblock and k % 256:
            k = 256  # the K-quants' and IQ4_XS's super-blocks are 256 wide
        n = 37
        blocks, reference = weights(type_name, n, k, seed=k)
        x = int8_inputs(rows, k)
        bias = torch.randn(n)
        out = ops.quant_linear(x, blocks, TYPES[type_name], bias, mode)
        within_int8_bound(out, x, reference, bias, (rows, k))


@pytest.mark.parametrize("type_name", ["Q4_1", "Q4_0", "Q8_0", "Q4_K", "Q6_K"])
def test_mode_1_takes_int8_activations_below_the_panels_and_the_panels_from_there(
    ops: Any, isa: str, type_name: str
) -> None:
    """Mode 1's switch is per type and path: 24 rows, 1024 where the avx2 path pairs Q4_0/Q4_1 groups,
    96 where it takes the K-quants a super-block at a time, 128 on the avx512 path."""
    kind = TYPES[type_name]
    switch = ops.int8_panel_rows(kind)
    paired = isa == "avx2" and type_name in ("Q4_0", "Q4_1")
    superblocks = isa == "avx2" and type_name.endswith("_K")
    assert switch == (1024 if paired else 96 if superblocks else 128 if isa == "avx512" else PANEL_ROWS)
    blocks, _ = weights(type_name, 8, 256)
    x = torch.randn(switch + 8, 256)
    for rows in (1, 7, 8, PANEL_ROWS - 1, PANEL_ROWS, 64, switch - 1, switch, switch + 8):
        float_out = ops.quant_linear(x[:rows], blocks, kind, None, FLOAT)
        int_out = ops.quant_linear(x[:rows], blocks, kind, None, INT)
        assert not torch.equal(float_out, int_out)  # the two modes are told apart
        assert torch.equal(ops.quant_linear(x[:rows], blocks, kind, None), float_out)  # the default: float
        panels = ops.quant_linear(x[:rows], blocks, kind, None, PANELS)  # their float32 GEMM
        expected = int_out if rows < switch else panels
        assert torch.equal(ops.quant_linear(x[:rows], blocks, kind, None, INT_BELOW_PANELS), expected), rows
    with pytest.raises(RuntimeError, match="mode must be 0-5"):
        ops.quant_linear(x, blocks, kind, None, 6)


@pytest.mark.parametrize("type_name", ["F16", "BF16"])
def test_float_weights_take_float_activations_in_every_mode(ops: Any, type_name: str) -> None:
    """F16/BF16 have no integer codes: the int8 modes run them as mode 0 does, exactly."""
    blocks, _ = weights(type_name, 9, 256)
    for rows in (3, 40):
        x = torch.randn(rows, 256)
        float_out = ops.quant_linear(x, blocks, TYPES[type_name], None, FLOAT)
        for mode in (INT_BELOW_PANELS, INT, INT_NO_VNNI):
            assert torch.equal(ops.quant_linear(x, blocks, TYPES[type_name], None, mode), float_out)


@pytest.mark.parametrize("type_name", TYPES)
def test_embedding_rows_decode_exactly(ops: Any, type_name: str) -> None:
    blocks, reference = weights(type_name, 50, 256, seed=1)
    ids = torch.tensor([0, 7, 49, 7, 25])  # 25: the zero row
    assert torch.equal(ops.quant_rows(blocks, TYPES[type_name], ids, 256), reference[ids])


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q8_0"])
def test_a_run_of_rows_of_a_bigger_tensor_is_read_in_place(ops: Any, type_name: str) -> None:
    """One expert of a [experts, N, row_bytes] tensor, or part of its rows, is a plain view: the
    kernel reads it where it lies, as a MoE layer calls it per expert."""
    experts, n, k = 3, 12, 256
    blocks, reference = weights(type_name, experts * n, k, seed=3)
    stacked, dense = blocks.view(experts, n, -1), reference.view(experts, n, k)
    x = torch.randn(5, k)
    for e in range(experts):
        for rows in (slice(0, n), slice(4, 9)):
            part = stacked[e, rows]
            assert part.data_ptr() == stacked[e, rows.start].data_ptr()  # no copy was made to get here
            out = ops.quant_linear(x, part, TYPES[type_name], None, FLOAT)
            within_float_rounding(out, x, dense[e, rows], None)
            assert torch.equal(
                ops.quant_rows(part, TYPES[type_name], torch.tensor([1]), k), dense[e, rows][1:2]
            )


def test_no_rows_and_non_contiguous_input(ops: Any) -> None:
    blocks, reference = weights("Q4_1", 8, 64)
    assert ops.quant_linear(torch.empty(0, 64), blocks, 3, None).shape == (0, 8)
    x = torch.randn(64, 3).T  # a transposed view: the kernel reads its own contiguous copy
    assert torch.allclose(ops.quant_linear(x, blocks, 3, None), x @ reference.T, atol=1e-4)


def test_bad_weights_are_refused_with_the_reason(ops: Any) -> None:
    blocks, _ = weights("Q4_1", 8, 64)
    with pytest.raises(RuntimeError, match="GGML type 15 is not supported"):
        ops.quant_linear(torch.randn(1, 64), blocks, 15, None)
    with pytest.raises(RuntimeError, match="a row of 64 weights of type 8 is 68 bytes, qweight has 40"):
        ops.quant_linear(torch.randn(1, 64), blocks, 8, None)
    with pytest.raises(RuntimeError, match="not a multiple of 256"):
        ops.quant_linear(torch.randn(1, 64), blocks, 14, None)
    with pytest.raises(RuntimeError, match="id 8 is outside"):
        ops.quant_rows(blocks, 3, torch.tensor([8]), 64)
    with pytest.raises(RuntimeError, match="rows are contiguous"):
        ops.quant_linear(torch.randn(1, 32), blocks[:, ::2], 3, None)
    f16 = torch.zeros(4, 2 * 48, dtype=torch.uint8)  # 48 F16 weights a row: not whole groups of 32
    with pytest.raises(RuntimeError, match="in_features 48 is not a multiple of 32"):
        ops.quant_linear(torch.randn(1, 48), f16, 1, None)


def test_the_type_table_is_ggmls():
    """KERNEL_TYPES (the loader's list of what stays packed) names GGML's own type numbers."""
    assert {name: int(gguf.GGMLQuantizationType[name]) for name in KERNEL_TYPES} == KERNEL_TYPES


# ---- Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K with every 8 output rows interleaved (kernels/cpu/quant_interleaved.cpp):
# 100 + type.
INTERLEAVED = {"Q4_0": 102, "Q4_1": 103, "Q5_0": 106, "Q8_0": 108, "Q4_K": 112, "Q5_K": 113, "Q6_K": 114}


@pytest.mark.parametrize("type_name", INTERLEAVED)
def test_interleaved_rows_read_as_the_stored_blocks_on_every_path(ops: Any, type_name: str) -> None:
    """The same bytes reordered: every row decodes exactly; the float32 modes (and the int8 modes on a
    path without int8 tiles over the layout) give the stored type's results bit for bit."""
    stored, layout = TYPES[type_name], INTERLEAVED[type_name]
    blocks, reference = weights(type_name, 40, 512, seed=4)
    rows = ops.interleave_rows(blocks, stored)
    assert rows.shape == blocks.shape and not torch.equal(rows, blocks)
    ids = torch.tensor([0, 7, 8, 20, 39, 7])  # 20: the zero row; chunk edges
    assert torch.equal(ops.quant_rows(rows, layout, ids, 512), reference[ids])
    bias = torch.randn(40)
    native = ops.interleaved_type(stored) == layout
    for count in (1, 5, PANEL_ROWS, 40):
        x = torch.randn(count, 512, generator=torch.Generator().manual_seed(count))
        for mode in (FLOAT, TILES, PANELS) if native else (FLOAT, INT_BELOW_PANELS, INT, TILES, PANELS):
            assert torch.equal(
                ops.quant_linear(x, rows, layout, bias, mode), ops.quant_linear(x, blocks, stored, bias, mode)
            ), (count, mode)


@pytest.mark.parametrize("type_name", INTERLEAVED)
def test_interleaved_int8_tiles_stay_within_the_bound_and_score_each_row_as_alone(
    ops: Any, isa: str, type_name: str
) -> None:
    """The avx2 and avx512 paths' int8 tiles over the layout: the int8 quantization bound (as above) at
    every row count, and each row bit for bit what it gives alone, across tiles of 1-7 rows and row
    blocks; on avx512 with and without VNNI, the same sums either way."""
    stored, layout = TYPES[type_name], INTERLEAVED[type_name]
    native = isa in ("avx2", "avx512")
    assert ops.interleaved_type(stored) == (layout if native else 0)
    native_switch = 512 if type_name in ("Q8_0", "Q6_K") else 1024
    assert ops.int8_panel_rows(layout) == (native_switch if native else ops.int8_panel_rows(stored))
    if not native:
        return  # the portable path reads the layout through the stored blocks (the test above)
    # 96 wide: 3 groups (the K-quants: one super-block). 23, 9 and 6 rows end in tiles of 7, 5 and 6 rows
    # (the K-quants: 4s, then 3, 1, 2). 8192 wide: row blocks of 16 rows (4 for the K-quants), so 37 cross them.
    narrow = 256 if type_name.endswith("_K") else 96
    for n, k, count in [(40, 512, 23), (16, narrow, 9), (16, narrow, 6), (24, 8192, 37)]:
        blocks, reference = weights(type_name, n, k, seed=k)
        rows = ops.interleave_rows(blocks, stored)
        x = int8_inputs(count, k)
        bias = torch.randn(n)
        together = ops.quant_linear(x, rows, layout, bias, INT)
        alone = torch.cat([ops.quant_linear(x[i : i + 1], rows, layout, bias, INT) for i in range(count)])
        assert torch.equal(together, alone), (n, k)
        assert torch.equal(ops.quant_linear(x, rows, layout, bias, INT_BELOW_PANELS), together)
        assert torch.equal(ops.quant_linear(x, rows, layout, bias, INT_NO_VNNI), together)
        within_int8_bound(together, x, reference, bias, (n, k))


def test_interleaving_refuses_what_has_no_layout(ops: Any) -> None:
    blocks, _ = weights("Q4_1", 12, 64)
    with pytest.raises(RuntimeError, match="type 7 has no interleaved layout"):
        ops.interleave_rows(weights("Q5_1", 8, 256)[0], 7)
    with pytest.raises(RuntimeError, match="12 rows are not whole chunks of 8"):
        ops.interleave_rows(blocks, 3)
    with pytest.raises(RuntimeError, match="interleaved rows \\(type 103\\) come in whole chunks of 8"):
        ops.quant_linear(torch.randn(1, 64), blocks, 103, None)
    assert ops.interleaved_type(7) == 0 and ops.interleaved_type(10) == 0
