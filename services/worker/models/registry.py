"""config.json -> which model class runs it, with which options.

Every supported architecture is the Llama decoder with small switches (biases, q/k norms, a sparse
mixture-of-experts MLP), so the register is a table of those switches, and `ModelConfig` is the one
parsed form of a config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedserve.services.checkpoint import context_length, token_ids
from pagedserve.services.worker.layers.moe import MoeConfig
from pagedserve.services.worker.layers.rope import RopeConfig
from pagedserve.services.worker.models.llama import LlamaForCausalLM
from pagedserve.services.worker.models.moe import MixtralForCausalLM, MoeForCausalLM


@dataclass(frozen=True, slots=True)
class MoeKeys:
    """Where a mixture-of-experts config.json keeps its expert settings."""

    expert_size_key: str  # each expert's intermediate size
    normalize_top_k: bool | None  # None: the config's `norm_topk_prob` (default False)
    shared_expert: bool = False  # `shared_expert_intermediate_size` sizes a gated shared expert
    # `mlp_only_layers` and `decoder_sparse_step` choose the sparse layers (else every layer is)
    sparse_step: bool = False


@dataclass(frozen=True, slots=True)
class Architecture:
    model_class: type[LlamaForCausalLM]
    qkv_bias: bool | None  # None: the config's `qkv_bias_key` decides
    o_bias: bool | None  # None: the config's `attention_bias` decides
    mlp_bias: bool | None  # None: the config's `mlp_bias` decides
    qk_norm: bool = False  # RMSNorm over each head of q and k, before the rotation
    default_head_dim: int | None = None  # when config.json has none; None = hidden_size / heads
    qk_norm_full: bool = False  # the q/k norms span the whole projection (OLMoE), not each head
    qkv_bias_key: str = "attention_bias"  # the config key that decides qkv_bias (qkv_bias None)
    qkv_bias_default: bool = False  # ... when the config lacks it
    moe: MoeKeys | None = None


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
    "Qwen2MoeForCausalLM": Architecture(
        MoeForCausalLM,
        qkv_bias=None,
        o_bias=False,
        mlp_bias=False,
        qkv_bias_key="qkv_bias",
        qkv_bias_default=True,
        moe=MoeKeys("moe_intermediate_size", None, shared_expert=True, sparse_step=True),
    ),
    "Qwen3MoeForCausalLM": Architecture(
        MoeForCausalLM,
        qkv_bias=None,
        o_bias=None,
        mlp_bias=False,
        qk_norm=True,
        moe=MoeKeys("moe_intermediate_size", None, sparse_step=True),
    ),
    "MixtralForCausalLM": Architecture(
        MixtralForCausalLM,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        moe=MoeKeys("intermediate_size", True),
    ),
    "OlmoeForCausalLM": Architecture(
        MoeForCausalLM,
        qkv_bias=None,
        o_bias=None,
        mlp_bias=False,
        qk_norm=True,
        qk_norm_full=True,
        moe=MoeKeys("intermediate_size", None),
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
    qk_norm_full: bool = False  # qk_norm over the whole q and k projections, not per head
    clip_qkv: float | None = None  # q, k and v clamped to [-clip, clip] (OLMoE)
    moe: MoeConfig | None = None  # None: every layer's MLP is dense


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
    if arch.qk_norm_full and heads * head_dim != hidden:
        raise ValueError(
            f"{name} normalises q over hidden_size: num_attention_heads * head_dim ({heads} * {head_dim}) "
            f"must equal hidden_size ({hidden})"
        )
    clip_qkv = hf.get("clip_qkv")
    if clip_qkv is not None and not arch.qk_norm_full:
        raise ValueError(
            f"clip_qkv is not supported for {name} (only with OLMoE's whole-projection q/k norms)"
        )
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
        qkv_bias=bool(hf.get(arch.qkv_bias_key, arch.qkv_bias_default))
        if arch.qkv_bias is None
        else arch.qkv_bias,
        o_bias=attention_bias if arch.o_bias is None else arch.o_bias,
        mlp_bias=pick(arch.mlp_bias, "mlp_bias"),
        qk_norm=arch.qk_norm,
        rope=RopeConfig.from_hf(hf),
        eos_token_ids=token_ids(hf.get("eos_token_id")),
        qk_norm_full=arch.qk_norm_full,
        clip_qkv=None if clip_qkv is None else float(clip_qkv),
        moe=None if arch.moe is None else parse_moe(arch.moe, hf),
    )


def parse_moe(keys: MoeKeys, hf: dict[str, Any]) -> MoeConfig:
    """The expert settings of a mixture-of-experts config.json; ValueError names a bad field."""
    layers = hf["num_hidden_layers"]
    # transformers writes either name for any of these architectures (its configs' attribute_map)
    experts = int(hf.get("num_experts") or hf.get("num_local_experts") or 0)
    top_k = int(hf.get("num_experts_per_tok") or 0)
    sparse = set(range(layers)) if experts else set()
    if keys.sparse_step:
        step = int(hf.get("decoder_sparse_step") or 1)
        if step < 1:
            raise ValueError(f"decoder_sparse_step must be >= 1; got {step}")
        dense = set(hf.get("mlp_only_layers") or ())
        sparse = {i for i in sparse if i not in dense and (i + 1) % step == 0}
    if sparse and not 1 <= top_k <= experts:
        raise ValueError(f"num_experts_per_tok must be in [1, num_experts={experts}]; got {top_k}")
    normalize = keys.normalize_top_k
    return MoeConfig(
        num_experts=experts,
        top_k=top_k,
        expert_size=int(hf[keys.expert_size_key]),
        normalize_top_k=bool(hf.get("norm_topk_prob", False)) if normalize is None else normalize,
        shared_expert_size=int(hf.get("shared_expert_intermediate_size") or 0) if keys.shared_expert else 0,
        sparse_layers=frozenset(sparse),
    )
