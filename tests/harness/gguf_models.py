"""A tiny checkpoint quantized in the test itself: its linears and embedding written to a GGUF.

`quantize_checkpoint(folder, "Q4_1")` writes `model.gguf` (the `gguf` package's writer) the way
llama.cpp's converter lays out a Llama model (q/k rows reordered for its rotary pairing, ggml tensor
names, the architecture's metadata, the tokenizer's vocabulary, special tokens and chat template), and
rewrites the folder's safetensors with the dequantized values of the same weights, so a
`--quantization none` load of the folder is the dequantize-then-float32 reference of the GGUF load.
The GGUF is a model by itself: `write_gguf(folder, path, "Q8_0")` writes it anywhere (a split set
with `split_max_tensors`), and `--model path` serves it with no folder beside it.
F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 are quantized by the gguf package; it has no quantizer for
the K-quants and the IQ4 types, so their blocks are made by gguf_quantizers.py.

Mixture-of-experts checkpoints are written as llama.cpp's converter writes them: each projection of a
layer's experts stacked into one 3-D tensor (`blk.N.ffn_gate_exps`, [n_expert, rows, cols]), the
router (`ffn_gate_inp`) and Qwen2-MoE's shared-expert gate (`ffn_gate_inp_shexp`, 1-D) kept float32,
Mixtral under the "llama" architecture (q/k rows reordered like any Llama's).
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
GGUF_ARCH = {
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


# A ChatML template, as SmolLM2's and Qwen's: written into the GGUF and the folder's tokenizer alike.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def quantize_checkpoint(
    folder: Path, type_name: str, embedding_type: str | None = None, expert_type: str | None = None
) -> Path:
    """Write folder/model.gguf with every linear in `type_name` (or, for a MIXES preset, each tensor in
    the preset's type; the embedding in `embedding_type`, a MoE's experts in `expert_type`, e.g.
    F16; default the same); rewrite the safetensors with the dequantized values -> the GGUF's path."""
    return write_gguf(
        folder, folder / "model.gguf", type_name, embedding_type, expert_type=expert_type, chat_template=None
    )


def write_gguf(
    folder: Path,
    path: Path,
    type_name: str,
    embedding_type: str | None = None,
    *,
    expert_type: str | None = None,
    chat_template: str | None = CHAT_TEMPLATE,
    split_max_tensors: int = 0,
) -> Path:
    """Write the checkpoint in `folder` as a GGUF model at `path`: every linear in `type_name` (F32 and
    F16 keep them unquantized), the embedding in `embedding_type` (default the same), the norms in F32,
    the metadata llama.cpp writes (shapes, RoPE, the tokenizer's vocabulary and special tokens, the
    chat template, which is also written into the folder's tokenizer so both forms chat alike).
    The folder's safetensors are rewritten with the dequantized values. split_max_tensors: a split set
    (`path`'s stem + `-00001-of-0000N.gguf`) -> the first file's path."""
    import json

    import gguf
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((folder / "config.json").read_text())
    arch = GGUF_ARCH[config["architectures"][0]]
    heads, kv_heads = (
        config["num_attention_heads"],
        config.get("num_key_value_heads") or config["num_attention_heads"],
    )
    files = sorted(folder.glob("*.safetensors"))
    writer = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    _write_metadata(writer, folder, config, chat_template)
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
            if (
                type_name in MIXES
                and values.ndim == 2
                and not (name == "model.embed_tokens.weight" and embedding_type)
            ):
                kind = MIXES[type_name](target)
            if ".ffn_gate_inp" in target:  # routers stay float32, as llama.cpp keeps them
                rewritten[name] = tensor
                writer.add_tensor(target, values.reshape(-1) if "_shexp" in target else values)
            elif values.ndim == 2 and kind in ("F32", "F16"):
                stored = values.astype(np.float32 if kind == "F32" else np.float16)
                rewritten[name] = torch.from_numpy(stored.astype(np.float32)).to(tensor.dtype)
                if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
                    stored = llama_permute(stored, heads if ".q_proj." in name else kv_heads)
                writer.add_tensor(target, stored)
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
        if "moe_intermediate_size" in config:  # Qwen's: as llama.cpp's converter writes them
            writer.add_uint32(f"{arch}.expert_feed_forward_length", config["moe_intermediate_size"])
        if config.get("shared_expert_intermediate_size"):
            writer.add_uint32(
                f"{arch}.expert_shared_feed_forward_length", config["shared_expert_intermediate_size"]
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(path)[0] if split_max_tensors else path


def _write_metadata(writer, folder: Path, config: dict, chat_template: str | None) -> None:
    """The keys llama.cpp's converter writes for these architectures, and the tokenizer."""
    import json

    import gguf
    from transformers import AutoTokenizer

    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    writer.add_name(folder.name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads") or heads)
    if head_dim != hidden // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    rope = config.get("rope_parameters") or {}  # transformers 5 keeps the theta there
    writer.add_rope_freq_base(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if config.get("clip_qkv"):  # OLMoE's (llama.cpp's own converter writes it for OLMo, not OLMoE)
        writer.add_clamp_kqv(config["clip_qkv"])
    writer.add_vocab_size(config["vocab_size"])
    if not (folder / "tokenizer_config.json").is_file():
        return  # a model without a tokenizer (make_tiny_model(with_tokenizer=False))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    vocab = tokenizer.get_vocab()
    special = set(tokenizer.all_special_ids)
    by_id = {i: t for t, i in vocab.items()}
    # Padded to the embedding's rows with unused tokens, as llama.cpp's converter pads a vocabulary.
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(config["vocab_size"])]
    types = [
        gguf.TokenType.CONTROL
        if i in special
        else gguf.TokenType.NORMAL
        if i in by_id
        else gguf.TokenType.UNUSED
        for i in range(config["vocab_size"])
    ]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"].get("merges") or []
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    # No merges (the tiny byte tokenizer has none) writes no merges key at all: the scores then tell
    # a reader that the vocabulary is complete as it stands (transformers derives merges from them).
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    if tokenizer.pad_token_id is not None:
        writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)  # the folder's tokenizer adds none either
    # llama.cpp also ends generation on these tokens by their text (transformers' Qwen2 tokenizer adds
    # <|endoftext|> to the tiny vocabulary); the folder's generation_config says so too, as Qwen's does.
    stops = sorted(
        {tokenizer.eos_token_id} | {i for i, t in by_id.items() if t in ("<|endoftext|>", "<|im_end|>")}
    )
    generation = folder / "generation_config.json"
    settings = json.loads(generation.read_text()) if generation.is_file() else {}
    generation.write_text(json.dumps({**settings, "eos_token_id": stops}, indent=2))
    if chat_template is not None:
        writer.add_chat_template(chat_template)
        tokenizer.chat_template = chat_template
        tokenizer.save_pretrained(folder)


def rewrite_gguf(
    source: Path,
    target: Path,
    *,
    metadata: dict[str, object] | None = None,
    drop: tuple[str, ...] = (),
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """Copy the GGUF `source` to `target` with metadata keys replaced or added (`metadata`: a value
    None removes the key; ints are written as uint32, floats as float32, lists as arrays of their
    first item's type), the keys or tensors named in `drop` left out, and `extra_tensors` appended:
    the broken or unusual files that error messages are tested on."""
    import gguf

    metadata = dict(metadata or {})
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(target, str(reader.fields["general.architecture"].contents()))
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture" or field.name in drop:
            continue
        if field.name in metadata:
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    for key, value in metadata.items():
        if value is not None:
            kind = gguf.GGUFValueType.get_type(value)
            kind = gguf.GGUFValueType.UINT32 if kind == gguf.GGUFValueType.INT32 else kind
            sub = gguf.GGUFValueType.get_type(value[0]) if isinstance(value, list) and value else None
            writer.add_key_value(key, value, kind, sub_type=sub)
    for tensor in reader.tensors:
        if tensor.name in drop:
            continue
        kind = gguf.GGMLQuantizationType(tensor.tensor_type)
        if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            writer.add_tensor(tensor.name, np.array(tensor.data))
        else:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=kind)
    for name, values in (extra_tensors or {}).items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
