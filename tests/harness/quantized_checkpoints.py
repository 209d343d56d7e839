"""GPTQ, AWQ and compressed-tensors checkpoints written in the test itself, in each format's own layout.

No model hub here: a tiny model's float linears are quantized round-to-nearest and packed the way
each format's tooling does (written from the formats' specs, one value at a time where packing is
involved, not from services/worker/weights/checkpoint_quant.py), and `dequantize` is each format's own
definition, weight = scale * (q - zero), for the tests' references:
  GPTQ   qweight int32 [in / per, out] packed along the input, lowest bits first; qzeros int32
         [groups, out / per] packed along the output; "gptq" (classic) stores zero - 1, "gptq_v2"
         the zero; scales fp16 [groups, out]; g_idx int32 [in].
  AWQ    qweight int32 [in, out / 8], qzeros int32 [groups, out / 8], nibble i of a word holding
         column 8 j + [0, 2, 4, 6, 1, 3, 5, 7][i]; scales fp16 [groups, out].
  compressed-tensors  signed codes (q - 2^(bits-1)) stored + 2^(bits-1): pack-quantized
         weight_packed int32 [out, in / per] along the input, weight_zero_point int32
         [out / per, groups] along the output (asymmetric only), weight_shape; int-quantized weight
         int8 [out, in]; weight_scale [out, groups] in the model's dtype (bfloat16 here).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass
class Quantized:
    """q [out, in] unsigned codes, scales [out, groups] float32 (already rounded to the stored dtype),
    zeros [out, groups] int64, and each input's group."""

    q: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray
    g_idx: np.ndarray
    bits: int


def rtn(
    weight: np.ndarray,
    bits: int,
    group_size: int,
    sym: bool,
    scale_dtype=np.float16,
    g_idx: np.ndarray | None = None,
) -> Quantized:
    """Round-to-nearest: per (row, group) a scale and a zero point, codes 0 .. 2^bits - 1.
    group_size -1: one group per row. g_idx: each input's group (default i // group_size)."""
    out, k = weight.shape
    size = k if group_size == -1 else group_size
    g_idx = np.arange(k) // size if g_idx is None else g_idx
    groups = int(g_idx.max()) + 1
    maxq = (1 << bits) - 1
    scales = np.zeros((out, groups), np.float32)
    zeros = np.zeros((out, groups), np.int64)
    for g in range(groups):
        cols = weight[:, g_idx == g]
        if sym:
            scale = np.abs(cols).max(1) / (maxq / 2)
            zero = np.full(out, (maxq + 1) // 2)
        else:
            lo, hi = np.minimum(cols.min(1), 0), np.maximum(cols.max(1), 0)
            scale = (hi - lo) / maxq
            zero = np.clip(np.round(-lo / scale), 0, maxq)
        scales[:, g] = torch.from_numpy(scale.astype(np.float32)).to(_torch(scale_dtype)).float().numpy()
        zeros[:, g] = zero
    q = np.clip(np.round(weight / scales[:, g_idx]) + zeros[:, g_idx], 0, maxq).astype(np.int64)
    return Quantized(q, scales, zeros, g_idx, bits)


def _torch(dtype) -> torch.dtype:
    return {np.float16: torch.float16, np.float32: torch.float32, "bfloat16": torch.bfloat16}[dtype]


def dequantize(qz: Quantized) -> np.ndarray:
    """The format's own definition: weight[o, i] = scale[o, g] * (q[o, i] - zero[o, g]), g = g_idx[i]."""
    g = qz.g_idx
    return (qz.scales[:, g] * (qz.q - qz.zeros[:, g])).astype(np.float32)


def _pack_rows(values: np.ndarray, bits: int) -> np.ndarray:
    """[rows, cols] -> int32 [rows / per, cols]: row r*per + i into bits i*bits.. of word r."""
    per = 32 // bits
    words = np.zeros((values.shape[0] // per, values.shape[1]), np.uint32)
    for r in range(words.shape[0]):
        for i in range(per):
            words[r] |= values[r * per + i].astype(np.uint32) << np.uint32(bits * i)
    return words.view(np.int32)


def _pack_cols(values: np.ndarray, bits: int, order=None) -> np.ndarray:
    """[rows, cols] -> int32 [rows, cols / per]: column c*per + order[i] into bits i*bits.. of word c."""
    per = 32 // bits
    order = order or tuple(range(per))
    words = np.zeros((values.shape[0], values.shape[1] // per), np.uint32)
    for c in range(words.shape[1]):
        for i in range(per):
            words[:, c] |= values[:, c * per + order[i]].astype(np.uint32) << np.uint32(bits * i)
    return words.view(np.int32)


def gptq_tensors(qz: Quantized, classic: bool = True) -> dict[str, torch.Tensor]:
    # The classic format stores zero - 1: a zero of 0 would wrap to 2^bits - 1 and read back as 2^bits
    # (the bug gptq_v2 fixes); rtn's zeros are at least 1 for rows that have a negative weight.
    assert not classic or (qz.zeros >= 1).all()
    stored_zeros = qz.zeros - 1 if classic else qz.zeros
    return {
        "qweight": torch.from_numpy(_pack_rows(qz.q.T, qz.bits)),
        "qzeros": torch.from_numpy(_pack_cols(stored_zeros.T, qz.bits)),
        "scales": torch.from_numpy(qz.scales.T.copy()).half(),
        "g_idx": torch.from_numpy(qz.g_idx.astype(np.int32)),
    }


def awq_tensors(qz: Quantized) -> dict[str, torch.Tensor]:
    return {
        "qweight": torch.from_numpy(_pack_cols(qz.q.T, 4, AWQ_ORDER)),
        "qzeros": torch.from_numpy(_pack_cols(qz.zeros.T, 4, AWQ_ORDER)),
        "scales": torch.from_numpy(qz.scales.T.copy()).half(),
    }


def ct_tensors(qz: Quantized, packed: bool, sym: bool) -> dict[str, torch.Tensor]:
    offset = 1 << (qz.bits - 1)
    scale = torch.from_numpy(qz.scales.copy()).bfloat16()
    out = {"weight_scale": scale}
    if packed:  # unsigned (signed + offset) values, packed
        out["weight_packed"] = torch.from_numpy(_pack_cols(qz.q, qz.bits))
        out["weight_shape"] = torch.tensor(qz.q.shape, dtype=torch.int64)
        if not sym:
            out["weight_zero_point"] = torch.from_numpy(_pack_rows(qz.zeros, qz.bits))
    else:
        out["weight"] = torch.from_numpy((qz.q - offset).astype(np.int8))
        out["weight_zero_point"] = torch.from_numpy((qz.zeros - offset).astype(np.int8))
    return out


def quantize_checkpoint_as(
    folder: Path,
    method: str,
    *,
    bits: int = 4,
    group_size: int = 32,
    sym: bool = False,
    fmt: str = "",
    desc_act_permuted: bool | str = False,
    zero_biases: bool = False,
    lm_head: bool = False,
) -> dict[str, torch.Tensor]:
    """Rewrite folder's decoder linears as `method` (gptq: fmt "gptq" or "gptq_v2"; compressed-tensors:
    fmt "pack-quantized" or "int-quantized") and add its quantization_config -> {`<module>.weight`:
    the format's own dequantization of it, float32} for the references. The embedding, the LM head,
    norms and biases stay dense, as these formats' tools leave them.
    desc_act_permuted: GPTQ's act-order (desc_act) with a g_idx that is not i // group_size; "shared":
    projections of one input (q/k/v, gate/up) in one order, as GPTQ's act-order gives them (their
    inputs' statistics are the same); True: each its own order.
    zero_biases: a zero `bias` beside every quantized linear that has none, as some GPTQ checkpoints carry.
    lm_head: quantize an untied LM head too (GPTQModel's lm_head option)."""
    from safetensors.torch import load_file, save_file

    config = json.loads((folder / "config.json").read_text())
    reference: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors = load_file(file)
        rewritten: dict[str, torch.Tensor] = {}
        for name, tensor in tensors.items():
            module = name.removesuffix(".weight")
            projection = name.endswith(".weight") and module.split(".", 3)[-1] in PROJECTIONS
            if not (projection or (lm_head and name == "lm_head.weight")):
                rewritten[name] = tensor
                continue
            weight = tensor.float().numpy()
            g_idx = None
            if desc_act_permuted:  # act-order: groups of inputs taken in a shuffled order
                perm = act_order(name, weight.shape[1], shared=desc_act_permuted == "shared")
                g_idx = np.empty(weight.shape[1], np.int64)
                g_idx[perm] = np.arange(weight.shape[1]) // group_size
            scale_dtype = "bfloat16" if method == "compressed-tensors" else np.float16
            qz = rtn(weight, bits, group_size, sym, scale_dtype, g_idx)
            reference[name] = torch.from_numpy(dequantize(qz))
            if method == "gptq":
                parts = gptq_tensors(qz, classic=fmt != "gptq_v2")
            elif method == "awq":
                parts = awq_tensors(qz)
            else:
                parts = ct_tensors(qz, packed=fmt == "pack-quantized", sym=sym)
            rewritten.update({f"{module}.{k}": v for k, v in parts.items()})
            if zero_biases and f"{module}.bias" not in tensors:
                rewritten[f"{module}.bias"] = torch.zeros(weight.shape[0], dtype=torch.float16)
        save_file(rewritten, file, metadata={"format": "pt"})
    config["quantization_config"] = quantization_config(
        method, bits, group_size, sym, fmt, bool(desc_act_permuted)
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return reference


def act_order(name: str, inputs: int, shared: bool) -> np.ndarray:
    """A made-up activation order of a projection's inputs (GPTQ sorts them by the Hessian's diagonal),
    seeded by its name, or by its layer and input where `shared`."""
    key = name
    if shared:
        for part, group in (
            ("q_proj", "qkv"),
            ("k_proj", "qkv"),
            ("v_proj", "qkv"),
            ("gate_proj", "mlp"),
            ("up_proj", "mlp"),
        ):
            key = key.replace(part, group)
    return np.random.default_rng(zlib.crc32(key.encode())).permutation(inputs)


def quantization_config(method: str, bits: int, group_size: int, sym: bool, fmt: str, desc_act: bool) -> dict:
    """config.json's quantization_config as each format's tooling writes it (the fields loaders read)."""
    if method == "gptq":
        return {
            "quant_method": "gptq",
            "bits": bits,
            "group_size": group_size,
            "sym": sym,
            "desc_act": desc_act,
            "checkpoint_format": fmt or "gptq",
        }
    if method == "awq":
        return {
            "quant_method": "awq",
            "bits": bits,
            "group_size": group_size,
            "zero_point": not sym,
            "version": "gemm",
        }
    weights = {
        "num_bits": bits,
        "type": "int",
        "symmetric": sym,
        "strategy": "channel" if group_size == -1 else "group",
        "group_size": None if group_size == -1 else group_size,
        "dynamic": False,
        "actorder": None,
    }
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}},
        "ignore": ["lm_head"],
        "quantization_status": "compressed",
    }
