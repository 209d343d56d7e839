"""A GGUF model's weights, memory-mapped and named as the Hugging Face checkpoint names them.

The file (or split set) is a model by itself (services/checkpoint.py reads its config and tokenizer
from the metadata), or a checkpoint folder holds it beside config.json. Either way its tensors are
views of the mapped file: `quantized_tensors` hands over those of a type the kernel runs, as stored
(install_quantized keeps them packed); `dense_tensors` dequantizes the rest, one tensor at a time and
in memory only (gguf's dequantizer), for a dense load or for the norms. Nothing is written to disk.

llama.cpp's converter reorders the rows of a Llama model's q and k projections (its rotary kernel
pairs adjacent dimensions where Hugging Face pairs the two halves of a head); the rows are put back
here. Rows are whole blocks, so reordering them is a gather of byte rows, exact for every type.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import structlog
import torch

from pagedserve.services.gguf_file import GGUFModel, TensorInfo, read_model
from pagedserve.services.worker.layers.quant_linear import QuantTensor, runs_packed
from pagedserve.services.worker.weights.gguf_types import (
    check_unpacked,
    describe,
    type_name,
    unpacked_matrices,
)

log = structlog.get_logger("pagedserve.loader")

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

# Where an architecture's layer names differ from the table above: Gemma's four norms (its `ffn_norm`
# normalises the MLP's input, Llama's the attention's output), Phi-3's fused projections (its `ffn_up`
# holds gate and up, [gate | up] as in the checkpoint).
_GEMMA_LAYER = {
    **_LAYER,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_ARCH_LAYER = {
    "gemma2": _GEMMA_LAYER,
    "gemma3": _GEMMA_LAYER,
    "phi3": {**_LAYER, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
# Architectures whose converted norms hold 1 + w where the checkpoint holds w (llama.cpp's converter
# adds the 1 to every Gemma norm): the loader must not add it again (models/llama.py weights_loaded).
UNIT_OFFSET_STORED = frozenset({"gemma2", "gemma3"})


def hf_name(gguf_name: str, architecture: str = "llama") -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None for a tensor we do not map
    (rope frequency tables and the like)."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    layer = _ARCH_LAYER.get(architecture, _LAYER)
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in layer:
        return f"model.layers.{parts[1]}.{layer[parts[2]]}.{parts[3]}"
    return None


def unpermute_rows(n_rows: int, n_heads: int) -> np.ndarray:
    """Row order that undoes llama.cpp's q/k reordering: per head, its row 2i+j goes back to j*hd/2+i."""
    head_dim = n_rows // n_heads
    return np.arange(n_rows).reshape(n_heads, head_dim // 2, 2).transpose(0, 2, 1).reshape(-1)


# Architectures whose q/k rows llama.cpp's converter reorders (its "normal" rotary mode).
PERMUTED_QK = frozenset({"llama"})


def qk_row_order(architecture: str, name: str, n_rows: int, heads: int, kv_heads: int) -> np.ndarray | None:
    """The gather that undoes llama.cpp's q/k reordering for the tensor of Hugging Face name `name` with
    `n_rows` rows (a LoRA B's are its outputs too), or None where the converter kept the order."""
    if architecture not in PERMUTED_QK or not (".q_proj." in name or ".k_proj." in name):
        return None
    return unpermute_rows(n_rows, heads if ".q_proj." in name else kv_heads)


def tensor_values(raw: np.ndarray, info: TensorInfo) -> torch.Tensor:
    """A tensor's bytes ([rows, row bytes]) as plain values in PyTorch's shape (ggml's dims reversed):
    F32/F16/BF16 as stored (views of `raw`), quantized types dequantized to float32."""
    import gguf
    from gguf.constants import GGMLQuantizationType

    kind = GGMLQuantizationType(info.type_id)
    if kind == GGMLQuantizationType.F32:
        values = torch.from_numpy(raw.view(np.float32))
    elif kind == GGMLQuantizationType.F16:
        values = torch.from_numpy(raw.view(np.float16))
    elif kind == GGMLQuantizationType.BF16:
        values = torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16)
    else:
        values = torch.from_numpy(gguf.quants.dequantize(raw, kind).astype(np.float32, copy=False))
    return values.reshape(tuple(reversed(info.dims)))


# Tensors that are settings rather than weights: services/gguf_config.py reads them into the config.
CONFIG_TENSORS = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})


@dataclass(slots=True)
class MappedGGUF:
    """A GGUF model's tensors by their Hugging Face names, over memory maps of its files."""

    model: GGUFModel
    tensors: dict[str, TensorInfo]  # Hugging Face name -> where it lies
    maps: dict[Path, np.memmap] = field(default_factory=dict)

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The tensor's bytes, [rows, row bytes], a view of the mapped file."""
        if info.file not in self.maps:
            # Copy-on-write: writable to numpy (torch.from_numpy warns on read-only memory), never written.
            self.maps[info.file] = np.memmap(info.file, dtype=np.uint8, mode="c")
        data = self.maps[info.file][info.start : info.start + info.nbytes]
        return data.reshape(info.rows, info.nbytes // info.rows)

    def row_order(self, name: str, info: TensorInfo) -> np.ndarray | None:
        """The gather that undoes llama.cpp's q/k reordering for this tensor, or None."""
        heads = self.model.arch_key("attention.head_count")
        kv_heads = self.model.arch_key("attention.head_count_kv") or heads
        length = info.dims[-1] if len(info.dims) == 2 else info.dims[0]  # rows, or a bias's elements
        return qk_row_order(self.model.architecture, name, length, heads, kv_heads)


def map_gguf(files: Path | Sequence[Path]) -> MappedGGUF:
    """Read the header of the model in `files` (a path, or a split set's parts) and name its tensors;
    ValueError for a tensor no loader knows (a newer architecture variant would be served wrong)."""
    first = Path(files) if isinstance(files, (str, Path)) else Path(files[0])
    model = read_model(first)
    named: dict[str, TensorInfo] = {}
    unknown = []
    for info in model.tensors.values():
        name = hf_name(info.name, model.architecture)
        if name is not None:
            named[name] = info
        elif info.name not in CONFIG_TENSORS:
            unknown.append(info.name)
    if unknown:
        shown = ", ".join(sorted(unknown)[:8]) + (
            f" (and {len(unknown) - 8} more)" if len(unknown) > 8 else ""
        )
        raise ValueError(
            f"{model.path} ({model.architecture}) holds tensors this loader does not know: {shown}"
        )
    return MappedGGUF(model, named)


def quantized_tensors(mapped: MappedGGUF, *, strict: bool = False) -> dict[str, QuantTensor]:
    """Every tensor in a type the kernel runs, by its Hugging Face name, as views of the mapped file
    (the q/k rows reordered into a copy). The rest (F32 norms, types the kernel lacks) are left to
    dense_tensors. A matrix in a type the kernel lacks is logged by name, or refused where `strict`
    (--quantization gguf; see gguf_types.py).

    The views cost no memory of their own; whoever keeps a weight copies it (install_quantized), so
    that once this dict is dropped the file is unmapped and each weight is resident exactly once."""
    unpacked = unpacked_matrices((info.name, info.type_id, info.dims) for info in mapped.tensors.values())
    check_unpacked(mapped.model.path.name, unpacked, strict=strict)
    if unpacked:
        log.warning("gguf weights not kept packed", file=mapped.model.path.name, detail=describe(unpacked))
    out: dict[str, QuantTensor] = {}
    for name, info in mapped.tensors.items():
        kind = type_name(info.type_id)
        if not runs_packed(kind, info.dims):
            continue
        data = mapped.raw(info)
        order = mapped.row_order(name, info)
        if order is not None:
            data = data[order]
        out[name] = QuantTensor(kind, torch.from_numpy(data), info.dims[0])
    return out


def dense_tensors(
    mapped: MappedGGUF, skip: set[str] | frozenset[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor but those in `skip`, as plain values in Hugging Face's shape and row order,
    one at a time: F32/F16/BF16 as stored (views of the file), quantized types dequantized in memory."""
    for name, info in mapped.tensors.items():
        if name in skip:
            continue
        values = tensor_values(mapped.raw(info), info)
        if name.endswith(".shared_expert_gate.weight") and values.dim() == 1:
            values = values.unsqueeze(0)  # [hidden] in the file, a [1, hidden] linear in the checkpoint
        order = mapped.row_order(name, info)
        if order is not None:
            values = values[torch.from_numpy(order)]
        yield name, values


def gguf_source(path: Path) -> Path | None:
    """The GGUF a model's weights come from (its first file), or None: for the peers that read it."""
    from pagedserve.services.checkpoint import read_checkpoint

    files = read_checkpoint(Path(path)).gguf_files
    return files[0] if files else None


def read_gguf(path: Path) -> dict[str, QuantTensor]:
    """The GGUF's tensors that stay quantized (quantized_tensors of the mapped file)."""
    return quantized_tensors(map_gguf(path))
