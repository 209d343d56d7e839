"""Quantizers for the GGML types the `gguf` package cannot write (the K-quants and the IQ4 types), in numpy.

Each takes [N, K] float32 rows and returns the blocks [N, K / block * block_bytes] uint8, laid out as
llama.cpp stores them (quant_formats.h has the table), so that `gguf.quants.dequantize` reads them back.
They are simple round-to-nearest quantizers (llama.cpp searches scales to cut the error further): good
blocks for tests, not a replacement for `llama-quantize`. tests/unit/kernels/test_gguf_quantizers.py
holds each to the gguf package's dequantizer and to an error bound of its step.
"""

from __future__ import annotations

import numpy as np

IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _fp16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to fp16 and back (what a block stores and a reader gets)."""
    return values.astype(np.float16).astype(np.float32)


def _fp16_bytes(*values: np.ndarray) -> np.ndarray:
    """[..., n values] fp16 bytes, each value's two bytes in turn."""
    stacked = np.stack(values, -1).astype(np.float16)
    return stacked.view(np.uint8).reshape(*stacked.shape[:-1], 2 * len(values))


def _divide(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """x / step, 0 where step is 0 (an all-zero group)."""
    return np.divide(
        x, step, out=np.zeros(np.broadcast_shapes(x.shape, step.shape), np.float32), where=step != 0
    )


def _extreme(x: np.ndarray) -> np.ndarray:
    """Along the last axis, the value of largest magnitude, sign kept (keepdims)."""
    return np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], -1)


def _super_blocks(dense: np.ndarray, sub: int) -> np.ndarray:
    """[N, K] -> [N, K / 256, 256 / sub, sub] float32."""
    n, k = dense.shape
    if k % 256:
        raise ValueError(f"a row of {k} weights is not whole super-blocks of 256")
    return dense.reshape(n, k // 256, 256 // sub, sub).astype(np.float32)


def _asymmetric(groups: np.ndarray, levels: int, scale_bits: int) -> tuple[np.ndarray, ...]:
    """Per sub-block w = d sc * code - dmin mn (codes 0..levels, sc/mn of scale_bits bits) -> (d, dmin,
    sc, mn, codes): Q2_K / Q4_K / Q5_K."""
    top = (1 << scale_bits) - 1
    lo = np.minimum(groups.min(-1), 0.0)
    scale = (groups.max(-1) - lo) / levels
    d, dmin = _fp16(scale.max(-1) / top), _fp16((-lo).max(-1) / top)
    sc = np.clip(np.round(_divide(scale, d[..., None])), 0, top).astype(np.uint8)
    mn = np.clip(np.round(_divide(-lo, dmin[..., None])), 0, top).astype(np.uint8)
    a, b = d[..., None] * sc, dmin[..., None] * mn
    codes = np.clip(np.round(_divide(groups + b[..., None], a[..., None])), 0, levels).astype(np.uint8)
    return d, dmin, sc, mn, codes


def _symmetric(groups: np.ndarray, low: int, scale_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sub-block w = d sc * q, q in [low, -low - 1], the largest magnitude at q = low, signed sc with
    |sc| <= scale_max -> (d, sc, q): Q3_K / Q6_K."""
    scale = _extreme(groups)[..., 0] / low
    d = _fp16(np.abs(scale).max(-1) / scale_max)
    sc = np.clip(np.round(_divide(scale, d[..., None])), -scale_max - 1, scale_max).astype(np.int8)
    q = np.clip(np.round(_divide(groups, (d[..., None] * sc)[..., None])), low, -low - 1).astype(np.int8)
    return d, sc, q


def _k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's eight 6-bit scales and mins [..., 8] -> their 12 packed bytes."""
    packed = np.zeros((*sc.shape[:-1], 12), np.uint8)
    packed[..., 0:4] = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
    packed[..., 4:8] = (mn[..., 0:4] & 63) | ((mn[..., 4:8] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:8] & 0xF) | ((mn[..., 4:8] & 0xF) << 4)
    return packed


def _nibble_pairs(codes: np.ndarray) -> np.ndarray:
    """[..., 8 groups, 32] 4-bit codes -> [..., 128]: groups 2j (low nibbles) and 2j+1 (high) share 32 bytes."""
    return (codes[..., 0::2, :] | (codes[..., 1::2, :] << 4)).reshape(*codes.shape[:-2], 128)


def _bit_planes(bits: np.ndarray, width: int) -> np.ndarray:
    """[..., G groups, 32] values of `width` bits -> [..., 32] bytes, group g's value at bit g * width."""
    out = np.zeros((*bits.shape[:-2], 32), np.uint8)
    for g in range(bits.shape[-2]):
        out |= (bits[..., g, :] << (g * width)).astype(np.uint8)
    return out


def quantize_q2_k(dense: np.ndarray) -> np.ndarray:
    n, blocks = dense.shape[0], dense.shape[1] // 256
    d, dmin, sc, mn, codes = _asymmetric(_super_blocks(dense, 16), 3, 4)
    scales = sc | (mn << 4)  # [n, b, 16]
    # group g = 4 * half + j of 32 codes: bits 2j of bytes 32 * half + l
    codes = codes.reshape(n, blocks, 2, 4, 32)
    qs = np.concatenate([_bit_planes(codes[:, :, h], 2) for h in range(2)], -1)
    return np.concatenate([scales, qs, _fp16_bytes(d, dmin)], -1).reshape(n, -1)


def quantize_q3_k(dense: np.ndarray) -> np.ndarray:
    n, blocks = dense.shape[0], dense.shape[1] // 256
    d, sc, q = _symmetric(_super_blocks(dense, 16), -4, 31)
    codes = (q + 4).astype(np.uint8).reshape(n, blocks, 8, 32)
    hmask = _bit_planes(codes >> 2, 1)
    low = (codes & 3).reshape(n, blocks, 2, 4, 32)
    qs = np.concatenate([_bit_planes(low[:, :, h], 2) for h in range(2)], -1)
    u = (sc.astype(np.int16) + 32).astype(np.uint8)  # [n, b, 16] six bits each
    scales = np.zeros((n, blocks, 12), np.uint8)
    scales[..., 0:8] = (u[..., 0:8] & 0xF) | ((u[..., 8:16] & 0xF) << 4)
    for i in range(16):
        scales[..., 8 + i % 4] |= ((u[..., i] >> 4) << (2 * (i // 4))).astype(np.uint8)
    return np.concatenate([hmask, qs, scales, _fp16_bytes(d)], -1).reshape(n, -1)


def quantize_q4_k(dense: np.ndarray) -> np.ndarray:
    n = dense.shape[0]
    d, dmin, sc, mn, codes = _asymmetric(_super_blocks(dense, 32), 15, 6)
    return np.concatenate([_fp16_bytes(d, dmin), _k_scales(sc, mn), _nibble_pairs(codes)], -1).reshape(n, -1)


def quantize_q5_k(dense: np.ndarray) -> np.ndarray:
    n = dense.shape[0]
    d, dmin, sc, mn, codes = _asymmetric(_super_blocks(dense, 32), 31, 6)
    qh = _bit_planes(codes >> 4, 1)
    parts = [_fp16_bytes(d, dmin), _k_scales(sc, mn), qh, _nibble_pairs(codes & 0xF)]
    return np.concatenate(parts, -1).reshape(n, -1)


def quantize_q6_k(dense: np.ndarray) -> np.ndarray:
    n, blocks = dense.shape[0], dense.shape[1] // 256
    d, sc, q = _symmetric(_super_blocks(dense, 16), -32, 127)
    codes = (q + 32).astype(np.uint8).reshape(n, blocks, 2, 4, 32)  # [half, k = g % 4, l]
    low, high = codes & 0xF, codes >> 4
    # Per half, 64 bytes of ql: k = 0, 1 in the low nibbles of bytes 0-31, 32-63; k = 2, 3 in their high ones.
    ql = (low[..., 0:2, :] | (low[..., 2:4, :] << 4)).reshape(n, blocks, 128)
    qh = np.stack([_bit_planes(high[:, :, h], 2) for h in range(2)], 2).reshape(n, blocks, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), _fp16_bytes(d)], -1).reshape(n, -1)


def _iq4_indices(x: np.ndarray) -> np.ndarray:
    """The codebook index nearest each value of x (in units of its scale)."""
    return np.abs(x[..., None] - IQ4_VALUES).argmin(-1).astype(np.uint8)


def _iq4_runs(indices: np.ndarray) -> np.ndarray:
    """[..., 32] indices -> [..., 16] bytes: index j in byte j's low nibble, index j + 16 in its high one."""
    return indices[..., :16] | (indices[..., 16:] << 4)


def quantize_iq4_nl(dense: np.ndarray) -> np.ndarray:
    n, k = dense.shape
    if k % 32:
        raise ValueError(f"a row of {k} weights is not whole blocks of 32")
    groups = dense.reshape(n, k // 32, 32).astype(np.float32)
    d = _fp16(_extreme(groups)[..., 0] / -127.0)
    indices = _iq4_indices(_divide(groups, d[..., None]))
    return np.concatenate([_fp16_bytes(d), _iq4_runs(indices)], -1).reshape(n, -1)


def quantize_iq4_xs(dense: np.ndarray) -> np.ndarray:
    n, blocks = dense.shape[0], dense.shape[1] // 256
    groups = _super_blocks(dense, 32)
    scale = _extreme(groups)[..., 0] / -127.0
    d = _fp16(np.abs(scale).max(-1) / 31)
    ls = np.clip(np.round(_divide(scale, d[..., None])), -32, 31)
    indices = _iq4_indices(_divide(groups, (d[..., None] * ls)[..., None]))
    u = (ls + 32).astype(np.uint16)  # [n, b, 8] six bits each
    scales_h = np.zeros((n, blocks), np.uint16)
    for s in range(8):
        scales_h |= ((u[..., s] >> 4) << (2 * s)).astype(np.uint16)
    scales_l = ((u[..., 0::2] & 0xF) | ((u[..., 1::2] & 0xF) << 4)).astype(np.uint8)
    parts = [
        _fp16_bytes(d),
        scales_h[..., None].view(np.uint8),
        scales_l,
        _iq4_runs(indices).reshape(n, blocks, 128),
    ]
    return np.concatenate(parts, -1).reshape(n, -1)


QUANTIZERS = {
    "Q2_K": quantize_q2_k,
    "Q3_K": quantize_q3_k,
    "Q4_K": quantize_q4_k,
    "Q5_K": quantize_q5_k,
    "Q6_K": quantize_q6_k,
    "IQ4_NL": quantize_iq4_nl,
    "IQ4_XS": quantize_iq4_xs,
}
