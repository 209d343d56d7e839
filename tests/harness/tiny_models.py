"""Tiny random Hugging Face checkpoints (Llama, Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3, Phi-3; the
mixture-of-experts Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE) for tests: a few MB, built in ~1 s.

`make_tiny_model("llama", folder)` writes config.json, generation_config.json, safetensors weights and a
byte-level tokenizer (one token per byte, ids 3..258; <pad>=0, <s>=1, </s>=2; no BOS added) into `folder`.
The Llama family's four differ on purpose (tied or not, GQA ratio 1/2/4, qkv bias, q/k norm, a
head_dim that is not hidden/heads), so together they cover every switch of our model code. The others
(`FAMILIES`) have odd shapes too (6 heads over 3 or 2 KV heads, head dims 24, 16 and 12) and sliding
windows that are no power of two and shorter than the test prompts: Gemma 2 slides every other layer
(13) and soft-caps attention (4) and logits (5); Gemma 3 slides two layers of three (11) with a local
rotary base of its own and a linearly scaled global one, q/k norms and a logit cap (8); Phi-3 rotates
half of each head (partial_rotary_factor 0.5) and slides every layer (29); `phi3-longrope` adds
LongRoPE (short and long factors, original context 48). The MoE models take odd shapes on purpose: 5
or 7 experts, top-3 routing, 3 or 6 heads, dense layers between sparse ones (Qwen's `mlp_only_layers`
and `decoder_sparse_step`), both `norm_topk_prob` settings, a shared expert (Qwen2-MoE),
whole-projection q/k norms and clip_qkv (OLMoE).
transformers is imported only when a model is built: conftest imports this module for everyone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")
FAMILIES = ("gemma2", "gemma3", "phi3", "phi3-longrope")
LONGROPE_ORIGINAL = 48  # phi3-longrope's original_max_position_embeddings
MOE_ARCHITECTURES = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe")
VOCAB_SIZE = 320  # > the tokenizer's 259 tokens, as in real models whose embedding is padded
BOS_ID, EOS_ID, PAD_ID = 1, 2, 0

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.2,  # large enough that greedy outputs vary instead of repeating one token
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": PAD_ID,
}
_PER_ARCH: dict[str, dict[str, Any]] = {
    "llama": {"num_hidden_layers": 3, "tie_word_embeddings": True},
    "qwen2": {"tie_word_embeddings": False},
    "qwen3": {"num_key_value_heads": 1, "head_dim": 32, "tie_word_embeddings": True},
    "mistral": {"num_key_value_heads": 4, "tie_word_embeddings": False},
    "gemma2": {
        "hidden_size": 72,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 3,
        "head_dim": 24,
        "sliding_window": 13,
        "query_pre_attn_scalar": 20,
        "attn_logit_softcapping": 4.0,
        "final_logit_softcapping": 5.0,
    },
    "gemma3": {
        "hidden_size": 72,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "sliding_window": 11,
        "sliding_window_pattern": 3,
        "rope_local_base_freq": 100.0,
        "rope_theta": 5000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "query_pre_attn_scalar": 20,
        "final_logit_softcapping": 8.0,
    },
    "phi3": {
        "hidden_size": 72,
        "intermediate_size": 96,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "partial_rotary_factor": 0.5,
        "sliding_window": 29,
        "tie_word_embeddings": False,
    },
    # 4 layers, sparse where (i + 1) % 2 == 0 (1 and 3), dense 0 and 2; a shared expert; k not renormalised
    "qwen2_moe": {
        "hidden_size": 96,
        "num_attention_heads": 3,
        "num_key_value_heads": 1,
        "num_hidden_layers": 4,
        "intermediate_size": 64,
        "num_experts": 5,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
        "decoder_sparse_step": 2,
        "norm_topk_prob": False,
        "tie_word_embeddings": False,
    },
    # layer 1 dense (mlp_only_layers), 0 and 2 sparse; per-head q/k norms; k renormalised
    "qwen3_moe": {
        "num_attention_heads": 3,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "num_hidden_layers": 3,
        "intermediate_size": 96,
        "num_experts": 7,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 32,
        "mlp_only_layers": [1],
        "norm_topk_prob": True,
        "tie_word_embeddings": True,
    },
    # q/k rows reordered in its GGUF (llama.cpp's "llama" arch); head_dim 16 with 6 heads != hidden / heads
    "mixtral": {
        "num_attention_heads": 6,
        "num_key_value_heads": 3,
        "head_dim": 16,
        "num_local_experts": 5,
        "num_experts_per_tok": 3,
        "tie_word_embeddings": False,
    },
    # q/k norms over the whole projection; clip_qkv small enough to clip
    "olmoe": {
        "hidden_size": 96,
        "num_attention_heads": 3,
        "num_key_value_heads": 3,
        "intermediate_size": 32,
        "num_experts": 7,
        "num_experts_per_tok": 3,
        "norm_topk_prob": False,
        "clip_qkv": 2.5,
        "tie_word_embeddings": False,
    },
}
_PER_ARCH["phi3-longrope"] = {
    **_PER_ARCH["phi3"],
    "max_position_embeddings": 192,
    "original_max_position_embeddings": LONGROPE_ORIGINAL,
    "rope_scaling": {
        "rope_type": "longrope",
        "short_factor": [1.0, 1.3, 2.1],
        "long_factor": [1.1, 2.9, 7.5],
    },
}


def tiny_config(arch: str, **overrides: Any) -> Any:
    """The transformers config of a tiny `arch` model; `overrides` replace any field (e.g. rope_scaling)."""
    import transformers

    classes = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mistral": transformers.MistralConfig,
        "gemma2": transformers.Gemma2Config,
        "gemma3": transformers.Gemma3TextConfig,
        "phi3": transformers.Phi3Config,
        "phi3-longrope": transformers.Phi3Config,
        "qwen2_moe": transformers.Qwen2MoeConfig,
        "qwen3_moe": transformers.Qwen3MoeConfig,
        "mixtral": transformers.MixtralConfig,
        "olmoe": transformers.OlmoeConfig,
    }
    if arch not in classes:
        raise ValueError(f"arch must be one of {', '.join(classes)}; got {arch!r}")
    return classes[arch](**{**_COMMON, **_PER_ARCH[arch], **overrides})


def make_tiny_model(
    arch: str,
    path: str | Path,
    *,
    seed: int = 0,
    max_shard_size: str | None = None,
    with_tokenizer: bool = True,
    **config_overrides: Any,
) -> Path:
    """Build a random tiny `arch` model and save it as a Hugging Face checkpoint folder -> the folder.

    Norm weights and biases are randomised too (transformers initialises them to 1 and 0, which
    would hide a norm or bias loaded into the wrong place). `max_shard_size` (e.g. "40KB") splits
    the weights into several files with a model.safetensors.index.json.
    """
    import torch
    import transformers

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(arch, **config_overrides))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "norm" in name:
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.1 * noise)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, **kwargs)
    if with_tokenizer:
        save_byte_tokenizer(folder)
    return folder


def save_byte_tokenizer(folder: Path) -> None:
    """A byte-level tokenizer with no merges: any text round-trips, one token per byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD_ID, "<s>": BOS_ID, "</s>": EOS_ID}
    for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet())):
        vocab[char] = 3 + i
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(folder)
