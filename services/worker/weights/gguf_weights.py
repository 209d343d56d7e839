"""A checkpoint's GGUF weights, read in their stored types, named as the Hugging Face checkpoint names them.

Which GGUF belongs to a checkpoint folder: the bundled model's folder records the file it was
converted from (`pagedserve_source.json`, see bundled.py); any other folder may hold exactly one
`*.gguf` beside its config.json and tokenizer. The folder still supplies the config, the tokenizer
and every tensor the GGUF does not keep quantized.

llama.cpp's converter reorders the rows of a Llama model's q and k projections (its rotary kernel
pairs adjacent dimensions where Hugging Face pairs the two halves of a head); the rows are put back
here. Rows are whole blocks, so reordering them is a gather of byte rows, exact for every type.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pagedserve.services.worker.layers.quant_linear import KERNEL_TYPES, QuantTensor

# GGUF tensor name parts -> Hugging Face's (the Llama family's names in both; Qwen's for a MoE block).
_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # Mixture-of-experts layers: the router, each projection of every expert as one 3-D tensor
    # [n_expert, rows, cols] (a name without an expert index, models/moe.py), the shared expert
    # and its gate ([hidden] in the file, [1, hidden] in the checkpoint).
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}


def hf_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None for a tensor we do not map
    (rope frequency tables and the like)."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
    return None


def gguf_source(folder: Path) -> Path | None:
    """The GGUF file this checkpoint folder's weights come from, or None where it has none."""
    source = folder / "pagedserve_source.json"
    if source.is_file():
        from pagedserve.services.worker.weights.bundled import find_bundled_gguf

        name = json.loads(source.read_text()).get("gguf")
        if name:
            bundled = find_bundled_gguf()
            if bundled.name != name:
                raise ValueError(
                    f"{source} names {name!r}, but the installed bundled GGUF is {bundled.name!r}"
                )
            return bundled
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) > 1:
        raise ValueError(
            f"{folder} holds {len(ggufs)} .gguf files ({', '.join(g.name for g in ggufs)}); keep one"
        )
    return ggufs[0] if ggufs else None


def _unpermute_rows(n_rows: int, n_heads: int) -> np.ndarray:
    """Row order that undoes llama.cpp's q/k reordering: per head, its row 2i+j goes back to j*hd/2+i."""
    head_dim = n_rows // n_heads
    return np.arange(n_rows).reshape(n_heads, head_dim // 2, 2).transpose(0, 2, 1).reshape(-1)


# GGUF metadata value types -> struct format of a scalar (8 string, 9 array: variable length).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] is the row length (in_features)
    type_id: int
    offset: int  # from the data section's start


def read_header(path: Path) -> tuple[dict[str, object], list[TensorInfo], int]:
    """-> (scalar and string metadata, tensor infos, the data section's offset in the file).

    Written here rather than gguf.GGUFReader because that reader makes a numpy view per element of
    every metadata array (the tokenizer's ~150K strings): 44 s on busy shared cores of an AMD EPYC
    (Zen 3) for the bundled 98 MB file, against well under a second skipping them here. Arrays are
    skipped, not kept: the weights need only scalars. The tensor bytes are then memory-mapped."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        return _parse_header(path, blob)


def _parse_header(path: Path, blob: mmap.mmap) -> tuple[dict[str, object], list[TensorInfo], int]:
    pos = 0

    def take(fmt: str):
        nonlocal pos
        values = struct.unpack_from("<" + fmt, blob, pos)
        pos += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string() -> str:
        nonlocal pos
        length = take("Q")
        pos += length
        return bytes(blob[pos - length : pos]).decode("utf-8", errors="replace")

    def value(kind: int):
        nonlocal pos
        if kind == 8:
            return string()
        if kind == 9:
            item_kind, count = take("I"), take("Q")
            if item_kind in _SCALARS:
                pos += count * struct.calcsize(_SCALARS[item_kind])
            else:
                for _ in range(count):
                    value(item_kind)
            return None
        return take(_SCALARS[kind])

    magic, version = take("4s"), take("I")
    if magic != b"GGUF" or version < 2:
        raise ValueError(
            f"{path} is not a GGUF file of version 2 or later (magic {magic!r}, version {version})"
        )
    n_tensors, n_kv = take("Q"), take("Q")
    meta: dict[str, object] = {}
    for _ in range(n_kv):
        key = string()
        found = value(take("I"))
        if found is not None:
            meta[key] = found
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = tuple(take("Q") for _ in range(take("I")))
        infos.append(TensorInfo(name, dims, take("I"), take("Q")))
    alignment = int(meta.get("general.alignment", 32))
    return meta, infos, -(-pos // alignment) * alignment


def read_gguf(path: Path) -> dict[str, QuantTensor]:
    """Every mapped tensor of the GGUF in a type the kernel runs, by its Hugging Face name, as views of
    the memory-mapped file (the q/k rows reordered into a copy). Other tensors (F32 norms, types the
    kernel lacks) are left out: the checkpoint folder holds them dense.

    The views cost no memory of their own; whoever keeps a weight copies it (install_quantized), so
    that once this dict is dropped the file is unmapped and each weight is resident exactly once."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    meta, infos, data_start = read_header(path)
    arch = meta.get("general.architecture")
    heads = meta.get(f"{arch}.attention.head_count")
    kv_heads = meta.get(f"{arch}.attention.head_count_kv") or heads
    # Copy-on-write: writable to numpy (torch.from_numpy warns on read-only memory), never written.
    mapped = np.memmap(path, dtype=np.uint8, mode="c")
    out: dict[str, QuantTensor] = {}
    for info in infos:
        name = hf_name(info.name)
        kind = GGMLQuantizationType(info.type_id)
        if name is None or kind.name not in KERNEL_TYPES:
            continue
        block, block_bytes = GGML_QUANT_SIZES[kind]
        row_bytes = info.dims[0] // block * block_bytes
        rows = int(np.prod(info.dims[1:])) if len(info.dims) > 1 else 1
        start = data_start + info.offset
        data = mapped[start : start + rows * row_bytes].reshape(rows, row_bytes)
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name) and len(info.dims) == 2:
            data = data[_unpermute_rows(rows, heads if ".q_proj." in name else kv_heads)]
        out[name] = QuantTensor(kind.name, torch.from_numpy(data), info.dims[0])
    return out
