"""The tests' own quantizers for the types the `gguf` package cannot write (tests/harness/gguf_quantizers.py),
read back by the gguf package's dequantizer: a misplaced bit of the layout would show as a large error."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from harness.gguf_quantizers import QUANTIZERS

# Relative RMS error of round-to-nearest at each type's bits on Gaussian rows (measured 0.33, 0.16, 0.08,
# 0.04, 0.02, 0.08, 0.08), with headroom; a layout error reads back noise, a relative error near 1 or more.
RMS_BOUND = {
    "Q2_K": 0.40,
    "Q3_K": 0.20,
    "Q4_K": 0.10,
    "Q5_K": 0.05,
    "Q6_K": 0.025,
    "IQ4_NL": 0.10,
    "IQ4_XS": 0.10,
}


@pytest.mark.parametrize("type_name", QUANTIZERS)
def test_the_gguf_dequantizer_reads_back_what_was_quantized(type_name: str) -> None:
    rng = np.random.default_rng(0)
    dense = (rng.standard_normal((24, 512)) * rng.uniform(0.01, 1.0, (24, 1))).astype(np.float32)
    dense[3] = 0.0  # an all-zero row: zero scales, no division by zero
    dense[5, :256] = np.abs(dense[5, :256])  # a super-block of positive weights: a zero minimum
    kind = gguf.GGMLQuantizationType[type_name]
    block, block_bytes = gguf.constants.GGML_QUANT_SIZES[kind]
    blocks = QUANTIZERS[type_name](dense)
    assert blocks.dtype == np.uint8 and blocks.shape == (24, 512 // block * block_bytes)
    back = gguf.quants.dequantize(blocks, kind).reshape(dense.shape)
    assert np.isfinite(back).all() and not back[3].any()
    rows = np.sqrt(((back - dense) ** 2).mean(-1) / np.maximum((dense**2).mean(-1), 1e-30))
    assert (rows[np.arange(24) != 3] <= RMS_BOUND[type_name]).all(), rows.max()


@pytest.mark.parametrize("type_name", QUANTIZERS)
def test_a_row_that_is_not_whole_blocks_is_refused(type_name: str) -> None:
    with pytest.raises(ValueError):
        QUANTIZERS[type_name](np.zeros((2, 48), np.float32))
