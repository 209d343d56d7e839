"""A tiny checkpoint quantized in the test itself: its linears and embedding written to a GGUF beside it.

`quantize_checkpoint(folder, "Q4_1")` writes `model.gguf` (the `gguf` package's writer) the way
llama.cpp's converter lays out a Llama model (q/k rows reordered for its rotary pairing, ggml tensor
names), and rewrites the folder's safetensors with the dequantized values of the same weights, so a
`--quantization none` load of the folder is the dequantize-then-float32 reference of the GGUF load.
Q8_0/Q4_0/Q4_1 are quantized by the gguf package; it has no Q4_K quantizer, so Q4_K's blocks are made
here (per 32 weights a 6-bit scale and min of the super-block's fp16 d and dmin, 4-bit codes).

Mixture-of-experts checkpoints are written as llama.cpp's converter writes them: each projection of a
layer's experts stacked into one 3-D tensor (`blk.N.ffn_gate_exps`, [n_expert, rows, cols]), the
router (`ffn_gate_inp`) and Qwen2-MoE's shared-expert gate (`ffn_gate_inp_shexp`, 1-D) kept float32,
Mixtral under the "llama" architecture (q/k rows reordered like any Llama's).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
    "mlp.gate": "ffn_gate_inp",
    "block_sparse_moe.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
# An expert's projection (Qwen/OLMoE names, then Mixtral's) -> the layer's stacked tensor.
_EXPERT_PARTS = {
    "gate_proj": "ffn_gate_exps",
    "up_proj": "ffn_up_exps",
    "down_proj": "ffn_down_exps",
    "w1": "ffn_gate_exps",
    "w3": "ffn_up_exps",
    "w2": "ffn_down_exps",
}
_ARCH = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "MixtralForCausalLM": "llama",
    "OlmoeForCausalLM": "olmoe",
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


def expert_name(hf: str) -> tuple[str, int] | None:
    """`model.layers.3.mlp.experts.5.up_proj.weight` -> (`blk.3.ffn_up_exps.weight`, 5); None if not an
    expert's tensor."""
    parts = hf.removeprefix("model.").split(".")
    if len(parts) == 7 and parts[0] == "layers" and parts[3] == "experts" and parts[5] in _EXPERT_PARTS:
        return f"blk.{parts[1]}.{_EXPERT_PARTS[parts[5]]}.{parts[6]}", int(parts[4])
    return None


def llama_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face row order -> llama.cpp's (per head, the two halves interleaved)."""
    n = rows.shape[0]
    return rows.reshape(heads, 2, n // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def quantize_q4_k(dense: np.ndarray) -> np.ndarray:
    """[N, K] float32 (K a multiple of 256) -> Q4_K blocks [N, K / 256 * 144] uint8."""
    n, k = dense.shape
    groups = dense.reshape(n, k // 256, 8, 32).astype(np.float32)
    lo = np.minimum(groups.min(-1), 0.0)
    scale = (groups.max(-1) - lo) / 15.0
    d = (scale.max(-1) / 63.0).astype(np.float16).astype(np.float32)
    dmin = ((-lo).max(-1) / 63.0).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d > 0, d, 1)[..., None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(-lo / np.where(dmin > 0, dmin, 1)[..., None]), 0, 63).astype(np.uint8)
    a = d[..., None] * sc
    b = dmin[..., None] * mn
    codes = np.clip(np.round((groups + b[..., None]) / np.where(a > 0, a, 1)[..., None]), 0, 15).astype(
        np.uint8
    )
    packed = np.zeros((n, k // 256, 12), np.uint8)
    packed[..., 0:4] = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
    packed[..., 4:8] = (mn[..., 0:4] & 63) | ((mn[..., 4:8] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:8] & 0xF) | ((mn[..., 4:8] & 0xF) << 4)
    # codes of groups 2j (low nibbles) and 2j+1 (high) share 32 bytes
    qs = (codes[..., 0::2, :] | (codes[..., 1::2, :] << 4)).reshape(n, k // 256, 128)
    head = np.stack([d, dmin], -1).astype(np.float16).view(np.uint8).reshape(n, k // 256, 4)
    return np.concatenate([head, packed, qs], -1).reshape(n, -1)


def quantize(dense: np.ndarray, type_name: str) -> tuple[np.ndarray, np.ndarray]:
    """-> (blocks, their dequantized float32 values)."""
    import gguf

    kind = gguf.GGMLQuantizationType[type_name]
    blocks = quantize_q4_k(dense) if type_name == "Q4_K" else gguf.quants.quantize(dense, kind)
    return blocks, gguf.quants.dequantize(blocks, kind).astype(np.float32)


def quantize_checkpoint(
    folder: Path, type_name: str, embedding_type: str | None = None, expert_type: str | None = None
) -> Path:
    """Write folder/model.gguf with every linear in `type_name` (the embedding in `embedding_type`, a
    MoE's experts in `expert_type`, e.g. F16; default the same); rewrite the safetensors with the
    dequantized values -> the GGUF's path."""
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
    experts: dict[str, dict[int, np.ndarray]] = {}  # stacked tensor -> expert -> its blocks
    for file in files:
        tensors = load_file(file)
        rewritten = {}
        for name, tensor in tensors.items():
            values = tensor.float().numpy()
            stacked = expert_name(name)
            if stacked is not None:
                blocks, dequantized = quantize(values, expert_type or type_name)
                rewritten[name] = torch.from_numpy(dequantized).to(tensor.dtype)
                experts.setdefault(stacked[0], {})[stacked[1]] = blocks
                continue
            target = gguf_name(name)
            if target is None:
                rewritten[name] = tensor
                continue
            kind = embedding_type or type_name if name == "model.embed_tokens.weight" else type_name
            if ".ffn_gate_inp" in target:  # routers stay float32, as llama.cpp keeps them
                rewritten[name] = tensor
                writer.add_tensor(target, values.reshape(-1) if "_shexp" in target else values)
            elif values.ndim == 2:
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
    for target, by_expert in sorted(experts.items()):
        stacked_blocks = np.stack([by_expert[e] for e in range(len(by_expert))])
        kind = gguf.GGMLQuantizationType[expert_type or type_name]
        writer.add_tensor(
            target, stacked_blocks, raw_dtype=None if stacked_blocks.dtype == np.float16 else kind
        )
    if experts:
        writer.add_uint32(f"{arch}.expert_count", len(next(iter(experts.values()))))
        writer.add_uint32(f"{arch}.expert_used_count", config["num_experts_per_tok"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return folder / "model.gguf"
