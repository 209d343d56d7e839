"""A tiny checkpoint quantized in the test itself: its linears and embedding written to a GGUF beside it.

`quantize_checkpoint(folder, "Q4_1")` writes `model.gguf` (the `gguf` package's writer) the way
llama.cpp's converter lays out a Llama model (q/k rows reordered for its rotary pairing, ggml tensor
names), and rewrites the folder's safetensors with the dequantized values of the same weights, so a
`--quantization none` load of the folder is the dequantize-then-float32 reference of the GGUF load.
F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 are quantized by the gguf package; it has no quantizer for
the K-quants and the IQ4 types, so their blocks are made by gguf_quantizers.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from harness.gguf_quantizers import QUANTIZERS

_HF_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_ARCH = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def gguf_name(hf: str) -> str | None:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.removeprefix("model.").split(".")
    if parts[0] == "layers":
        module = ".".join(parts[2:-1])
        if module in _HF_TO_GGUF:
            return f"blk.{parts[1]}.{_HF_TO_GGUF[module]}.{parts[-1]}"
    return None


def llama_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face row order -> llama.cpp's (per head, the two halves interleaved)."""
    n = rows.shape[0]
    return rows.reshape(heads, 2, n // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def quantize(dense: np.ndarray, type_name: str) -> tuple[np.ndarray, np.ndarray]:
    """-> (blocks, their dequantized float32 values)."""
    import gguf

    kind = gguf.GGMLQuantizationType[type_name]
    if type_name in QUANTIZERS:
        blocks = QUANTIZERS[type_name](dense)
    else:
        blocks = gguf.quants.quantize(dense.astype(np.float32), kind).view(np.uint8)
    return blocks, gguf.quants.dequantize(blocks, kind).astype(np.float32).reshape(dense.shape)


def _k_mix(base: str) -> Callable[[str], str]:
    """llama.cpp's Q4_K_M / Q5_K_M mixes, simplified: the base K-quant, Q6_K for the embedding and the LM
    head, and for attn_v and ffn_down in every other layer (llama.cpp picks about half of them)."""

    def type_of(gguf_tensor: str) -> str:
        if gguf_tensor in ("token_embd.weight", "output.weight"):
            return "Q6_K"
        parts = gguf_tensor.split(".")
        if parts[2] in ("attn_v", "ffn_down") and int(parts[1]) % 2 == 0:
            return "Q6_K"
        return base

    return type_of


# Every other type the kernel runs, one per tensor kind, so that one small model reads them all.
_EVERY_TYPE = {
    "token_embd": "BF16",
    "output": "F16",
    "attn_q": "Q2_K",
    "attn_k": "Q3_K",
    "attn_v": "IQ4_XS",
    "attn_output": "Q5_K",
    "ffn_gate": "Q6_K",
    "ffn_up": "IQ4_NL",
}


def _every_type(gguf_tensor: str) -> str:
    parts = gguf_tensor.split(".")
    if parts[0] == "blk" and parts[2] == "ffn_down":
        return "Q5_0" if int(parts[1]) % 2 else "Q5_1"
    return _EVERY_TYPE[parts[0] if parts[0] != "blk" else parts[2]]


# Presets of a type per tensor, as the GGUF files users download mix them (rows must be whole 256-weight
# super-blocks: hidden and intermediate sizes multiples of 256).
MIXES = {"Q4_K_M": _k_mix("Q4_K"), "Q5_K_M": _k_mix("Q5_K"), "every-type": _every_type}


def quantize_checkpoint(folder: Path, type_name: str, embedding_type: str | None = None) -> Path:
    """Write folder/model.gguf with every linear in `type_name` (or, for a MIXES preset, each tensor in
    the preset's type; the embedding in `embedding_type`, default the same); rewrite the safetensors
    with the dequantized values -> the GGUF's path."""
    import json

    import gguf
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((folder / "config.json").read_text())
    arch = _ARCH[config["architectures"][0]]
    heads, kv_heads = (
        config["num_attention_heads"],
        config.get("num_key_value_heads") or config["num_attention_heads"],
    )
    files = sorted(folder.glob("*.safetensors"))
    writer = gguf.GGUFWriter(folder / "model.gguf", arch)
    writer.add_uint32(f"{arch}.attention.head_count", heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", kv_heads)
    for file in files:
        tensors = load_file(file)
        rewritten = {}
        for name, tensor in tensors.items():
            target = gguf_name(name)
            values = tensor.float().numpy()
            if target is None:
                rewritten[name] = tensor
                continue
            if values.ndim == 2:
                kind = MIXES[type_name](target) if type_name in MIXES else type_name
                if name == "model.embed_tokens.weight" and embedding_type:
                    kind = embedding_type
                blocks, dequantized = quantize(values, kind)
                rewritten[name] = torch.from_numpy(dequantized).to(tensor.dtype)
                stored = blocks
                if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
                    stored = llama_permute(blocks, heads if ".q_proj." in name else kv_heads)
                writer.add_tensor(target, stored, raw_dtype=gguf.GGMLQuantizationType[kind])
            else:
                rewritten[name] = tensor
                writer.add_tensor(target, values)
        save_file(rewritten, file, metadata={"format": "pt"})
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return folder / "model.gguf"
