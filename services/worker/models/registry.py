"""config.json -> which model class runs it, with which options.

Every supported architecture is the Llama decoder with small switches (biases, q/k norms, sliding
windows, soft-capping, the activation, a sparse mixture-of-experts MLP), or a family file beside it
where the layer differs (models/gemma.py: four norms a layer; models/phi3.py: q/k/v and gate/up fused
in the checkpoint; models/moe.py: the experts). The register is a table of those, and `ModelConfig` is
the one parsed form of a config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedserve.services.checkpoint import context_length, token_ids
from pagedserve.services.worker.layers.moe import MoeConfig
from pagedserve.services.worker.layers.rope import RopeConfig
from pagedserve.services.worker.models import attention_layout as layout
from pagedserve.services.worker.models.gemma import GemmaForCausalLM
from pagedserve.services.worker.models.llama import LlamaForCausalLM
from pagedserve.services.worker.models.moe import MixtralForCausalLM, MoeForCausalLM
from pagedserve.services.worker.models.phi3 import Phi3ForCausalLM

# What the gated MLP may apply to its gate (config `hidden_act`, Gemma's `hidden_activation`).
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


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
    windows: layout.WindowLayout = layout.no_windows  # which layers slide, how far
    ropes: layout.RopeLayout = layout.one_rope  # the rotary of full layers, and of sliding ones
    attn_softcap: bool = False  # honours `attn_logit_softcapping` (transformers' Gemma 3 ignores it)
    gemma: bool = False  # norms multiply by 1 + w; embeddings scaled by sqrt(hidden); query_pre_attn_scalar
    defaults: tuple[tuple[str, Any], ...] = ()  # transformers' config defaults a config.json may leave out
    qk_norm_full: bool = False  # the q/k norms span the whole projection (OLMoE), not each head
    qkv_bias_key: str = "attention_bias"  # the config key that decides qkv_bias (qkv_bias None)
    qkv_bias_default: bool = False  # ... when the config lacks it
    moe: MoeKeys | None = None


_GEMMA = {"qkv_bias": None, "o_bias": None, "mlp_bias": False, "gemma": True, "default_head_dim": 256}
_GEMMA_DEFAULTS = (
    ("hidden_activation", "gelu_pytorch_tanh"),
    ("query_pre_attn_scalar", 256),
    ("sliding_window", 4096),
    ("tie_word_embeddings", True),
)

ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": Architecture(LlamaForCausalLM, qkv_bias=None, o_bias=None, mlp_bias=None),
    "MistralForCausalLM": Architecture(
        LlamaForCausalLM, qkv_bias=False, o_bias=False, mlp_bias=False, windows=layout.every_layer
    ),
    "Qwen2ForCausalLM": Architecture(
        LlamaForCausalLM, qkv_bias=True, o_bias=False, mlp_bias=False, windows=layout.qwen_layers
    ),
    "Qwen3ForCausalLM": Architecture(
        LlamaForCausalLM,
        qkv_bias=None,
        o_bias=None,
        mlp_bias=False,
        qk_norm=True,
        default_head_dim=128,
        windows=layout.qwen_layers,
    ),
    "Gemma2ForCausalLM": Architecture(
        GemmaForCausalLM,
        **_GEMMA,
        windows=layout.gemma2_layers,
        attn_softcap=True,
        defaults=(*_GEMMA_DEFAULTS, ("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0)),
    ),
    "Gemma3ForCausalLM": Architecture(
        GemmaForCausalLM,
        **_GEMMA,
        qk_norm=True,
        windows=layout.gemma3_layers,
        ropes=layout.gemma3_ropes,
        defaults=_GEMMA_DEFAULTS,
    ),
    "Phi3ForCausalLM": Architecture(
        Phi3ForCausalLM,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        windows=layout.every_layer,
        ropes=layout.phi3_rope,
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
    rope: RopeConfig  # full-attention layers' (every layer's, unless sliding_rope is set)
    eos_token_ids: tuple[int, ...]
    hidden_act: str = "silu"
    attention_scale: float = 0.0  # softmax(q k^T * scale); 0: head_dim ** -0.5
    layer_windows: tuple[int | None, ...] = ()  # per layer: a sliding window, or None; () = none anywhere
    sliding_rope: RopeConfig | None = None  # the sliding layers' rotary, where it differs (Gemma 3)
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    norm_unit_offset: bool = False  # Gemma: every RMSNorm multiplies by 1 + w
    embed_scale: float | None = None  # Gemma: embeddings times sqrt(hidden_size), in the model dtype

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def scale(self) -> float:
        return self.attention_scale or self.head_dim**-0.5

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
    hf = {**dict(arch.defaults), **hf}
    activation = hf.get("hidden_activation") or hf.get("hidden_act", "silu")
    if activation not in ACTIVATIONS:
        raise ValueError(f"hidden_act {activation!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    if hf.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention (an encoder's attention) is not supported")
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
    rope, sliding_rope = arch.ropes(hf)
    scalar = hf["query_pre_attn_scalar"] if arch.gemma else None

    def pick(fixed: bool | None, key: str) -> bool:
        return bool(hf.get(key, False)) if fixed is None else fixed

    def cap(key: str) -> float | None:
        value = hf.get(key)
        return float(value) if value else None

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
        max_model_len=context_length(hf),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=bool(hf.get(arch.qkv_bias_key, arch.qkv_bias_default))
        if arch.qkv_bias is None
        else arch.qkv_bias,
        o_bias=attention_bias if arch.o_bias is None else arch.o_bias,
        mlp_bias=pick(arch.mlp_bias, "mlp_bias"),
        qk_norm=arch.qk_norm,
        rope=rope,
        eos_token_ids=token_ids(hf.get("eos_token_id")),
        hidden_act=activation,
        attention_scale=float(scalar) ** -0.5 if scalar else 0.0,
        layer_windows=arch.windows(hf),
        sliding_rope=sliding_rope,
        attn_logit_softcap=cap("attn_logit_softcapping") if arch.attn_softcap else None,
        final_logit_softcap=cap("final_logit_softcapping"),
        norm_unit_offset=arch.gemma,
        embed_scale=float(hidden) ** 0.5 if arch.gemma else None,
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
