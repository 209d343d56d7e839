"""GPTQ, AWQ and compressed-tensors int4/int8 weights, repacked into the GGML blocks our kernel runs.

A Hugging Face checkpoint whose config.json has a `quantization_config` stores each quantized linear
as integer codes, per-group scales and zero points, weight = scale * (code - zero), in one of three
layouts. Each is read here into one form (`IntWeight`: codes and zeros unsigned, 0 .. 2^bits - 1,
[out, in] and [out, groups]) and that form becomes GGML blocks of 32 weights, one (a, b) per block
(kernels/cpu/quant_linear.cpp); a group of 128 repeats its scale over four blocks:

  int4, every zero 8 (symmetric)  -> Q4_0  d = scale                    exact
  int4, any other zeros           -> Q4_1  d = scale, m = -scale * zero  m rounded to fp16
  int8, every zero 128            -> Q8_0  d = scale, code - 128 as int8 exact

d is the checkpoint's scale as fp16: exact for GPTQ's and AWQ's fp16 scales and for bfloat16 scales
in fp16's normal range, one rounding for float32 ones. m = -scale * zero rounded to fp16 moves each
weight of the block by the same amount, at most 2^-11 of |scale * zero| (under 1% of a quantization
step for zeros up to 16). A desc_act weight (GPTQ's act-order g_idx) has its input columns sorted by
group and the layer reads its inputs in that order. Anything else (asymmetric int8, a group or an
in_features that is not a multiple of 32, a g_idx with unequal groups) has no block form:
`kernel_type` says why, and the loader uses `dequantize` instead. Tensors in, tensors out: the
loader reads the files.

The layouts (read back equal from AutoGPTQ's, AutoAWQ's and compressed-tensors' own packers):
  GPTQ  qweight int32 [in / (32 / bits), out], packed along the input, lowest bits first; qzeros
        int32 [groups, out / (32 / bits)] packed along the output; scales fp16 [groups, out]; g_idx
        int32 [in]. checkpoint_format "gptq" (the classic one) stores zero - 1, "gptq_v2" the zero.
  AWQ   (version "gemm") qweight int32 [in, out / 8] and qzeros int32 [groups, out / 8], eight
        4-bit values an int32 in the order 0, 2, 4, 6, 1, 3, 5, 7; scales fp16 [groups, out].
  compressed-tensors  signed codes stored + 2^(bits-1): "pack-quantized" weight_packed int32
        [out, in / (32 / bits)] packed along the input, lowest bits first, weight_zero_point (if
        asymmetric) int32 [out / (32 / bits), groups] packed along the output; "int-quantized" /
        "naive-quantized" weight int8 [out, in] signed, weight_zero_point int8. weight_scale
        [out, groups] (1 group for the "channel" strategy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pagedserve.services.worker.layers.quant_linear import QuantTensor

METHODS = ("gptq", "awq", "compressed-tensors")
GROUP = 32  # weights per GGML block of Q4_0 / Q4_1 / Q8_0
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # packed nibble i holds column _AWQ_ORDER[i] of its 8
_AWQ_COLUMNS = tuple(_AWQ_ORDER.index(c) for c in range(8))  # column c is nibble _AWQ_COLUMNS[c]


@dataclass(frozen=True, slots=True)
class Scheme:
    """What config.json's quantization_config says about the quantized linears."""

    method: str  # one of METHODS
    bits: int  # 4 or 8
    group_size: int  # -1: one group per output row (per channel)
    layout: str  # gptq: "gptq" | "gptq_v2"; awq: "gemm"; compressed-tensors: its "format"
    # desc_act / actorder need no field: a g_idx that is not i // group_size is read from the tensors

    @property
    def marker(self) -> str:
        """The tensor suffix that marks a quantized linear (`<module>.<marker>`)."""
        if self.method in ("gptq", "awq"):
            return "qweight"
        return "weight_packed" if self.layout == "pack-quantized" else "weight_scale"

    @property
    def suffixes(self) -> tuple[str, ...]:
        """The tensors of one quantized linear, by suffix (its bias, if any, stays a dense tensor)."""
        if self.method == "gptq":
            return ("qweight", "qzeros", "scales", "g_idx")
        if self.method == "awq":
            return ("qweight", "qzeros", "scales")
        packed = self.layout == "pack-quantized"
        return (
            "weight_packed" if packed else "weight",
            "weight_scale",
            "weight_zero_point",
            "weight_g_idx",
            "weight_shape",
        )


def parse_scheme(config: dict[str, Any]) -> Scheme | None:
    """config.json -> its Scheme; None where it has no quantization_config of a method in METHODS.
    ValueError naming the field for one of those methods in a form this module cannot read."""
    qc = config.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_method") not in METHODS:
        return None
    method = qc["quant_method"]
    if method == "compressed-tensors":
        return _compressed_tensors_scheme(qc)
    bits = _check_bits(method, "bits", qc.get("bits", qc.get("w_bit")))
    group_size = qc.get("group_size", qc.get("q_group_size", -1))
    _check_group(method, "group_size", group_size)
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"awq: quantization_config.version={version!r}: only 'gemm' is supported")
        if not qc.get("zero_point", True):
            raise ValueError(
                "awq: quantization_config.zero_point=false is not supported (only zero_point: true)"
            )
        if bits != 4:
            raise ValueError(f"awq: quantization_config.bits={bits}: AWQ's gemm layout is 4-bit only")
        return Scheme("awq", 4, group_size, "gemm")
    layout = qc.get("checkpoint_format") or "gptq"
    if layout not in ("gptq", "gptq_v2"):
        raise ValueError(f"gptq: quantization_config.checkpoint_format={layout!r}: only 'gptq' and 'gptq_v2'")
    return Scheme("gptq", bits, group_size, layout)


def _check_bits(method: str, field: str, bits: Any) -> int:
    """-> bits, checked to be 4 or 8."""
    if bits not in (4, 8):
        raise ValueError(f"{method}: quantization_config.{field}={bits!r}: only 4 and 8 bits are supported")
    return int(bits)


def _check_group(method: str, field: str, group_size: Any) -> None:
    if not isinstance(group_size, int) or (group_size <= 0 and group_size != -1):
        raise ValueError(f"{method}: quantization_config.{field}={group_size!r}: a positive size or -1")


def _compressed_tensors_scheme(qc: dict[str, Any]) -> Scheme:
    fmt = qc.get("format")
    if fmt not in ("pack-quantized", "int-quantized", "naive-quantized"):
        raise ValueError(
            f"compressed-tensors: quantization_config.format={fmt!r}: only pack-quantized, "
            "int-quantized and naive-quantized (integer weights) are supported"
        )
    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        raise ValueError(
            f"compressed-tensors: quantization_status={status!r}: only a compressed checkpoint's "
            "weights are stored quantized"
        )
    groups = qc.get("config_groups") or {}
    weights = [g.get("weights") for g in groups.values()]
    if not weights or any(w is None for w in weights) or any(w != weights[0] for w in weights):
        raise ValueError(
            "compressed-tensors: quantization_config.config_groups must all quantize weights, alike "
            f"({len(weights)} groups here)"
        )
    for name, group in groups.items():
        if group.get("input_activations") or group.get("output_activations"):
            raise ValueError(
                f"compressed-tensors: config_groups.{name}.input_activations: quantized activations "
                "are not supported (weight-only checkpoints only)"
            )
    args = weights[0]
    if args.get("type", "int") != "int":
        raise ValueError(f"compressed-tensors: weights.type={args.get('type')!r}: only 'int'")
    _check_bits("compressed-tensors", "config_groups.*.weights.num_bits", args.get("num_bits"))
    strategy = args.get("strategy")
    if strategy == "channel":
        group_size = -1
    elif strategy == "group":
        group_size = args.get("group_size")
        _check_group("compressed-tensors", "config_groups.*.weights.group_size", group_size)
    else:
        raise ValueError(f"compressed-tensors: weights.strategy={strategy!r}: only 'channel' and 'group'")
    if args.get("dynamic"):
        raise ValueError("compressed-tensors: weights.dynamic=true is not supported")
    return Scheme("compressed-tensors", args["num_bits"], group_size, fmt)


@dataclass(frozen=True, slots=True)
class IntWeight:
    """One quantized linear: weight[o, i] = scales[o, g] * (codes[o, i] - zeros[o, g]), g = g_idx[i]."""

    codes: torch.Tensor  # uint8 [out, in], 0 .. 2^bits - 1
    scales: torch.Tensor  # float [out, groups]
    zeros: torch.Tensor  # int32 [out, groups]
    bits: int
    group_size: int  # inputs per group (in_features for one group per row)
    g_idx: torch.Tensor | None = None  # int64 [in]: only where it is not the plain i // group_size

    @property
    def shape(self) -> tuple[int, int]:
        out_features, in_features = self.codes.shape  # 2-D: [out, in]
        return out_features, in_features

    def dequantize(self) -> torch.Tensor:
        """The float32 [out, in] weight, exactly as the format defines it."""
        if self.g_idx is not None:
            g = self.g_idx
            return self.scales.float()[:, g] * (self.codes.int() - self.zeros[:, g]).float()
        out, in_features = self.shape
        groups = self.codes.reshape(out, in_features // self.group_size, self.group_size)
        weight = (groups.float() - self.zeros.float()[:, :, None]) * self.scales.float()[:, :, None]
        return weight.reshape(out, in_features)


def _values(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words [rows, cols] -> uint8 [rows, cols, 32 / bits]: each word's values, lowest bits first.
    Byte arithmetic on the words' little-endian bytes (as every CPU we build for stores them)."""
    data = packed.contiguous().view(torch.int32).unsqueeze(-1).view(torch.uint8)  # [rows, cols, 4]
    if bits == 8:
        return data
    return torch.stack((data & 0xF, data >> 4), dim=-1).flatten(-2)  # 4 bits: [rows, cols, 8]


def _unpack(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words -> their 32 / bits values (lowest bits first) laid out consecutively along `dim`."""
    values = _values(packed, bits)
    if dim == 0:
        return values.permute(0, 2, 1).reshape(-1, packed.shape[1])
    return values.reshape(packed.shape[0], -1)


def _g_idx(g_idx: torch.Tensor | None, in_features: int, group_size: int, name: str) -> torch.Tensor | None:
    """None where the checkpoint's group index is absent or the plain i // group_size."""
    if g_idx is None:
        return None
    g_idx = g_idx.long()
    if g_idx.shape != (in_features,):
        raise ValueError(f"{name}: shape {tuple(g_idx.shape)}, expected ({in_features},)")
    if torch.equal(g_idx, torch.arange(in_features) // group_size):
        return None
    return g_idx


def _expect(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name}: shape {tuple(tensor.shape)}, expected {shape}")


def read_linear(scheme: Scheme, tensors: dict[str, torch.Tensor], module: str) -> IntWeight:
    """One linear's tensors (by suffix, from `scheme.suffixes`) -> its IntWeight. `module` names it in errors."""
    for suffix in ("qweight", "qzeros", "weight_packed"):
        if suffix in tensors and tensors[suffix].dtype != torch.int32:
            raise ValueError(f"{module}.{suffix} is {tensors[suffix].dtype}; packed words are int32")
    missing = [s for s in _required(scheme) if s not in tensors]
    if missing:
        raise ValueError(f"{module} lacks {', '.join(f'{module}.{s}' for s in missing)}")
    if scheme.method == "gptq":
        return _read_gptq(scheme, tensors, module)
    if scheme.method == "awq":
        return _read_awq(scheme, tensors, module)
    return _read_compressed_tensors(scheme, tensors, module)


def _required(scheme: Scheme) -> tuple[str, ...]:
    if scheme.method in ("gptq", "awq"):
        return ("qweight", "qzeros", "scales")
    return ("weight_packed" if scheme.layout == "pack-quantized" else "weight", "weight_scale")


def _group_count(in_features: int, group_size: int, name: str) -> int:
    if in_features % group_size:
        raise ValueError(f"{name}: in_features {in_features} is not a multiple of group_size {group_size}")
    return in_features // group_size


def _read_gptq(scheme: Scheme, t: dict[str, torch.Tensor], module: str) -> IntWeight:
    bits, per = scheme.bits, 32 // scheme.bits
    # [in / per, out]: value i of word (r, o) is input r * per + i of output o; the words transposed
    # (a quarter or an eighth of the bytes of the codes) then unpacked are the codes [out, in]
    words = t["qweight"].T.contiguous()
    codes = _values(words, bits).reshape(words.shape[0], -1)
    out, in_features = codes.shape
    group_size = in_features if scheme.group_size == -1 else scheme.group_size
    groups = t["scales"].shape[0]
    _expect(f"{module}.scales", t["scales"], (groups, out))
    _expect(f"{module}.qzeros", t["qzeros"], (groups, out // per))
    zeros = _unpack(t["qzeros"], bits, dim=1).T.int()  # [out, groups]
    if scheme.layout == "gptq":
        zeros = zeros + 1  # the classic format stores zero - 1 (and its kernels add 1, unmasked)
    g_idx = _g_idx(t.get("g_idx"), in_features, group_size, f"{module}.g_idx")
    if g_idx is None and groups != _group_count(in_features, group_size, module):
        raise ValueError(
            f"{module}.scales: {groups} groups for {in_features} inputs of group_size {group_size}"
        )
    if g_idx is not None and int(g_idx.max()) >= groups:
        raise ValueError(f"{module}.g_idx: group {int(g_idx.max())} of {groups}")
    return IntWeight(codes, t["scales"].T.contiguous(), zeros.contiguous(), bits, group_size, g_idx)


def _read_awq(scheme: Scheme, t: dict[str, torch.Tensor], module: str) -> IntWeight:
    def columns(packed: torch.Tensor) -> torch.Tensor:  # [rows, out / 8] -> [out, rows], AWQ's order undone
        values = _values(packed, 4)[:, :, list(_AWQ_COLUMNS)]  # [rows, out / 8, 8]
        return values.permute(1, 2, 0).reshape(-1, packed.shape[0])

    codes = columns(t["qweight"])  # [out, in]
    out, in_features = codes.shape
    group_size = in_features if scheme.group_size == -1 else scheme.group_size
    groups = _group_count(in_features, group_size, module)
    _expect(f"{module}.scales", t["scales"], (groups, out))
    _expect(f"{module}.qzeros", t["qzeros"], (groups, out // 8))
    zeros = columns(t["qzeros"]).int()
    return IntWeight(codes, t["scales"].T.contiguous(), zeros, 4, group_size)


def _read_compressed_tensors(scheme: Scheme, t: dict[str, torch.Tensor], module: str) -> IntWeight:
    bits, offset = scheme.bits, 1 << (scheme.bits - 1)
    if scheme.layout == "pack-quantized":
        packed = t["weight_packed"]
        shape = t.get("weight_shape")
        out, in_features = (
            (int(shape[0]), int(shape[1]))
            if shape is not None
            else (packed.shape[0], packed.shape[1] * 32 // bits)
        )
        codes = _unpack(packed, bits, dim=1)[:, :in_features].contiguous()  # stored + offset already
    else:
        weight = t["weight"]
        if weight.dtype.is_floating_point:
            raise ValueError(f"{module}.weight is {weight.dtype}, a quantized linear's codes are integers")
        out, in_features = weight.shape
        codes = (weight.int() + offset).to(torch.uint8)
    _expect(f"{module}.codes", codes, (out, in_features))
    group_size = in_features if scheme.group_size == -1 else scheme.group_size
    groups = _group_count(in_features, group_size, module)
    scales = t["weight_scale"].reshape(out, -1)
    if scales.shape[1] != groups:
        raise ValueError(
            f"{module}.weight_scale: {scales.shape[1]} groups for {in_features} inputs of group_size {group_size}"
        )
    zp = t.get("weight_zero_point")
    if zp is None:
        zeros = torch.full((out, groups), offset, dtype=torch.int32)
    elif zp.numel() == out * groups:  # one signed zero per group, not packed
        zeros = zp.reshape(out, groups).int() + offset
    else:  # packed along the output, stored + offset
        zeros = _unpack(zp, bits, dim=0)[:out].int()
        _expect(f"{module}.weight_zero_point (unpacked)", zeros, (out, groups))
    g_idx = _g_idx(t.get("weight_g_idx"), in_features, group_size, f"{module}.weight_g_idx")
    return IntWeight(codes, scales.contiguous(), zeros.contiguous(), bits, group_size, g_idx)


def kernel_type(w: IntWeight) -> tuple[str | None, str]:
    """-> (the GGML type this weight repacks to, "") or (None, why it cannot)."""
    out, in_features = w.shape
    if w.g_idx is not None:
        sizes = torch.bincount(w.g_idx)
        if not (sizes == w.group_size).all():
            return None, "desc_act: its g_idx puts unequal numbers of inputs in its groups"
    if in_features % GROUP:
        return None, f"in_features {in_features} is not a multiple of {GROUP}"
    if w.group_size % GROUP:
        return None, f"group_size {w.group_size} is not a multiple of {GROUP}"
    if not torch.isfinite(w.scales.half()).all():
        return None, "a scale overflows fp16"
    if w.bits == 8:
        if (w.zeros == 128).all():
            return "Q8_0", ""
        return None, "asymmetric int8 (zero points other than 128) has no kernel format"
    if (w.zeros == 8).all():
        return "Q4_0", ""
    if not torch.isfinite((w.scales.float() * w.zeros).half()).all():
        return None, "a scale * zero overflows fp16"
    return "Q4_1", ""


def to_blocks(w: IntWeight, type_name: str, source: str) -> QuantTensor:
    """The weight as `type_name` blocks (kernel_type's answer, or Q4_1 for a Q4_0 weight: exact,
    m = -8 d); `source` names the checkpoint format in the runtime's weight listing.

    A desc_act weight (a g_idx) has its input columns sorted by group, which makes its groups
    contiguous; the QuantTensor's `input_order` then says which input each column reads (the layer
    gathers x's columns in that order first: y = x[:, order] W[:, order]^T, the same sum)."""
    out, in_features = w.shape
    blocks = in_features // GROUP
    scale = w.scales.float().repeat_interleave(w.group_size // GROUP, dim=1)  # [out, blocks]
    order = None if w.g_idx is None else torch.argsort(w.g_idx, stable=True)
    codes = (w.codes if order is None else w.codes[:, order]).reshape(out, blocks, GROUP)

    sizes = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
    if type_name not in sizes:
        raise ValueError(f"no repack into {type_name}")
    data = torch.empty(out, blocks, sizes[type_name], dtype=torch.uint8)
    # fp16 values as their two little-endian bytes, [out, blocks, 2]
    data[:, :, 0:2] = scale.half().unsqueeze(-1).view(torch.uint8)
    if type_name == "Q8_0":
        torch.sub(codes, 128, out=data[:, :, 2:])  # uint8 wraps: code - 128 as int8's two's complement
    else:
        if type_name == "Q4_1":
            zero = w.zeros.float().repeat_interleave(w.group_size // GROUP, dim=1)
            data[:, :, 2:4] = (-scale * zero).half().unsqueeze(-1).view(torch.uint8)
        body = data[:, :, -16:]
        torch.bitwise_left_shift(codes[:, :, 16:], 4, out=body)  # codes 0-15 low nibbles, 16-31 high
        body |= codes[:, :, :16]
    data = data.reshape(out, -1)
    return QuantTensor(type_name, data, in_features, source, order)
