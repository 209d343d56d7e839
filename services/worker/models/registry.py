"""config.json -> which model class runs it, with which options.

Every supported architecture is the Llama decoder with small switches (biases, per-head q/k norms),
so the register is a table of those switches, and `ModelConfig` is the one parsed form of a config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedserve.services.checkpoint import context_length, token_ids
from pagedserve.services.worker.layers.rope import RopeConfig
from pagedserve.services.worker.models.llama import LlamaForCausalLM


@dataclass(frozen=True, slots=True)
class Architecture:
    model_class: type[LlamaForCausalLM]
    qkv_bias: bool | None  # None: the config's `attention_bias` decides
    o_bias: bool | None  # None: the config's `attention_bias` decides
    mlp_bias: bool | None  # None: the config's `mlp_bias` decides
    qk_norm: bool = False  # RMSNorm over each head of q and k, before the rotation
    default_head_dim: int | None = None  # when config.json has none; None = hidden_size / heads


ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": Architecture(LlamaForCausalLM, qkv_bias=None, o_bias=None, mlp_bias=None),
    "MistralForCausalLM": Architecture(LlamaForCausalLM, qkv_bias=False, o_bias=False, mlp_bias=False),
    "Qwen2ForCausalLM": Architecture(
        LlamaForCausalLM,
        qkv_bias=True,
        o_bias=False,
        mlp_bias=False,
    ),
    "Qwen3ForCausalLM": Architecture(
        LlamaForCausalLM,
        qkv_bias=None,
        o_bias=None,
        mlp_bias=False,
        qk_norm=True,
        default_head_dim=128,
    ),
}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    max_model_len: int  # the longest context this worker serves exactly
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    rope: RopeConfig
    eos_token_ids: tuple[int, ...]


def resolve(hf: dict[str, Any]) -> tuple[type[LlamaForCausalLM], ModelConfig]:
    """config.json -> (the class that runs it, its parsed config)."""
    config = parse_config(hf)
    return ARCHITECTURES[config.architecture].model_class, config


def parse_config(hf: dict[str, Any]) -> ModelConfig:
    """A Hugging Face config.json (as a dict) -> ModelConfig; ValueError names what is unsupported."""
    names = hf.get("architectures") or []
    supported = [n for n in names if n in ARCHITECTURES]
    if not supported:
        raise ValueError(
            f"unsupported model architecture {names or hf.get('model_type')!r}; "
            f"supported: {', '.join(ARCHITECTURES)}"
        )
    name = supported[0]
    arch = ARCHITECTURES[name]
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise ValueError(
            f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
        )
    head_dim = hf.get("head_dim") or arch.default_head_dim or hidden // heads
    max_pos = hf.get("max_position_embeddings", 2048)
    attention_bias = bool(hf.get("attention_bias", False))

    def pick(fixed: bool | None, key: str) -> bool:
        return bool(hf.get(key, False)) if fixed is None else fixed

    return ModelConfig(
        architecture=name,
        vocab_size=hf["vocab_size"],
        hidden_size=hidden,
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        max_position_embeddings=max_pos,
        max_model_len=context_length(hf),  # capped at a sliding window: services/checkpoint.py
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=attention_bias if arch.qkv_bias is None else arch.qkv_bias,
        o_bias=attention_bias if arch.o_bias is None else arch.o_bias,
        mlp_bias=pick(arch.mlp_bias, "mlp_bias"),
        qk_norm=arch.qk_norm,
        rope=RopeConfig.from_hf(hf),
        eos_token_ids=token_ids(hf.get("eos_token_id")),
    )
