"""A tiny checkpoint quantized in the test itself: its linears and embedding written to a GGUF beside it.

`quantize_checkpoint(folder, "Q4_1")` writes `model.gguf` (the `gguf` package's writer) the way
llama.cpp's converter lays out a Llama model (q/k rows reordered for its rotary pairing, ggml tensor
names), and rewrites the folder's safetensors with the dequantized values of the same weights, so a
`--quantization none` load of the folder is the dequantize-then-float32 reference of the GGUF load.
F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 are quantized by the gguf package; it has no quantizer for
the K-quants and the IQ4 types, so their blocks are made by gguf_quantizers.py.
"""

from __future__ import annotations

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


def quantize_checkpoint(folder: Path, type_name: str, embedding_type: str | None = None) -> Path:
    """Write folder/model.gguf with every linear in `type_name` (the embedding in `embedding_type`,
    default the same); rewrite the safetensors with the dequantized values -> the GGUF's path."""
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
            kind = embedding_type or type_name if name == "model.embed_tokens.weight" else type_name
            if values.ndim == 2:
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
