"""A GGUF model's metadata -> the config.json that a Hugging Face checkpoint of it would carry.

With it every service treats a `.gguf` like a checkpoint folder: services/checkpoint.py reads limits
and EOS ids from it, the worker's registry (services/worker/models/registry.py) picks the model class
from its `architectures`, exactly as for a folder. Keys are llama.cpp's (`{arch}.context_length`, as
gguf.Keys spells them), read the way llama.cpp reads them.

Adding an architecture is one entry in GGUF_ARCHITECTURES: the config.json class name and model type,
the keys beyond COMMON_FIELDS it renames, the values llama.cpp hard-codes for it rather than storing
them, and (rarely) a function for what a rename cannot say. The tensor names live beside the weight
loader (services/worker/weights/gguf_weights.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pagedserve.services import gguf_gemma_phi
from pagedserve.services.gguf_file import GGUFError, GGUFModel

# `{arch}.<key>` -> config.json field, for every architecture.
COMMON_FIELDS: Mapping[str, str] = {
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
}
# Keys llama.cpp refuses a file without (for every architecture here; an entry adds its own).
_REQUIRED = (
    "context_length",
    "embedding_length",
    "block_count",
    "attention.head_count",
    "attention.layer_norm_rms_epsilon",
)
_FLOAT_FIELDS = frozenset(
    {"rms_norm_eps", "rope_theta", "attn_logit_softcapping", "final_logit_softcapping", "clip_qkv"}
)  # the rest of COMMON_FIELDS are counts

# Tokens llama.cpp ends generation on by their text, besides the ids the file names (eos, eot, eom):
# chat models mark the end of a turn with one of these, whatever their eos_token_id says.
END_OF_GENERATION_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
    }
)


# A mixture of experts' keys (`{arch}.<key>` -> config.json field).
MOE_FIELDS: Mapping[str, str] = {
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
}


def _moe_layers(config: dict[str, Any], model: GGUFModel) -> None:
    """Which layers are sparse, from the tensors the file holds: a layer with a router is (llama.cpp's
    own files have one in every layer; a file may hold dense layers too, which then are served as such)."""
    layers = config["num_hidden_layers"]
    config["decoder_sparse_step"] = 1
    config["mlp_only_layers"] = [
        i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in model.tensors
    ]
    config.setdefault("intermediate_size", config["moe_intermediate_size"])  # a dense layer's, if any


def _mixtral(config: dict[str, Any], model: GGUFModel) -> None:
    """llama.cpp's converter writes Mixtral under `llama`: a llama file with experts is one (every
    layer sparse, each expert `feed_forward_length` wide, the chosen experts' weights renormalised)."""
    if "num_experts" in config:
        config["architectures"], config["model_type"] = ["MixtralForCausalLM"], "mixtral"
        config["num_local_experts"] = config.pop("num_experts")


@dataclass(frozen=True, slots=True)
class GGUFArchitecture:
    hf_architecture: str  # config.json's architectures[0]: what the worker's registry knows
    model_type: str
    fields: Mapping[str, str] = field(default_factory=dict)  # beyond COMMON_FIELDS: `{arch}.<key>` -> field
    fixed: Mapping[str, Any] = field(default_factory=dict)  # what llama.cpp hard-codes for the architecture
    required: tuple[str, ...] = ("feed_forward_length",)  # `{arch}.<key>`s beyond _REQUIRED
    adjust: Callable[[dict[str, Any], GGUFModel], None] | None = None  # anything a rename cannot say


def _qwen_moe(
    hf_architecture: str, model_type: str, *, renormalise: bool, shared_expert: bool = False
) -> GGUFArchitecture:
    """A Qwen mixture of experts: every expert key required, the chosen experts' weights renormalised
    or not (norm_topk_prob), and qwen2moe's always-on shared expert beside them."""
    fields = dict(MOE_FIELDS)
    if shared_expert:
        fields["expert_shared_feed_forward_length"] = "shared_expert_intermediate_size"
    return GGUFArchitecture(
        hf_architecture,
        model_type,
        fields=fields,
        fixed={"norm_topk_prob": renormalise},
        required=tuple(fields),
        adjust=_moe_layers,
    )


GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    "llama": GGUFArchitecture("LlamaForCausalLM", "llama", fields=MOE_FIELDS, adjust=_mixtral),
    "qwen2": GGUFArchitecture("Qwen2ForCausalLM", "qwen2"),
    "qwen3": GGUFArchitecture("Qwen3ForCausalLM", "qwen3"),
    # services/gguf_gemma_phi.py: what llama.cpp reads for these beyond the renames, and its defaults
    "gemma2": GGUFArchitecture(
        "Gemma2ForCausalLM",
        "gemma2",
        fields={
            "attn_logit_softcapping": "attn_logit_softcapping",
            "final_logit_softcapping": "final_logit_softcapping",
        },
        adjust=gguf_gemma_phi.gemma,
    ),
    "gemma3": GGUFArchitecture(
        "Gemma3ForCausalLM",
        "gemma3_text",
        fields={"final_logit_softcapping": "final_logit_softcapping"},
        adjust=gguf_gemma_phi.gemma,
    ),
    "phi3": GGUFArchitecture("Phi3ForCausalLM", "phi3", adjust=gguf_gemma_phi.phi3),
    # Mixtures of experts. llama.cpp renormalises the chosen experts' weights for qwen3moe and not for
    # qwen2moe, as the released models' Hugging Face configs say (norm_topk_prob).
    "qwen3moe": _qwen_moe("Qwen3MoeForCausalLM", "qwen3_moe", renormalise=True),
    "qwen2moe": _qwen_moe("Qwen2MoeForCausalLM", "qwen2_moe", renormalise=False, shared_expert=True),
    # q/k norms over the whole projection; experts `feed_forward_length` wide, weights not renormalised
    # (OLMoE's norm_topk_prob, which llama.cpp hard-codes). llama.cpp's converter writes no clamp for
    # OLMoE (the released model has none); a file that states one (`attention.clamp_kqv`) gets it.
    "olmoe": GGUFArchitecture(
        "OlmoeForCausalLM",
        "olmoe",
        fields={**MOE_FIELDS, "attention.clamp_kqv": "clip_qkv"},
        fixed={"norm_topk_prob": False},
        required=("feed_forward_length", "expert_count", "expert_used_count"),
    ),
}


def hf_config(model: GGUFModel) -> dict[str, Any]:
    """The config.json of `model` (read with the tokenizer's tokens kept: EOS ids are found by text)."""
    arch_name = model.architecture
    arch = GGUF_ARCHITECTURES.get(arch_name)
    if arch is None:
        raise GGUFError(
            f"{model.path}: architecture {arch_name!r} (general.architecture) is not supported; "
            f"supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    missing = [f"{arch_name}.{key}" for key in (*_REQUIRED, *arch.required) if model.arch_key(key) is None]
    if missing:
        raise GGUFError(f"{model.path} lacks metadata the model needs: {', '.join(missing)}")
    config: dict[str, Any] = {"architectures": [arch.hf_architecture], "model_type": arch.model_type}
    for key, name in {**COMMON_FIELDS, **arch.fields}.items():
        value = model.arch_key(key)
        if value is not None:
            config[name] = _checked(model, key, _one_value(model, key, value), name in _FLOAT_FIELDS)
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    config["vocab_size"] = vocab_size(model)
    config["tie_word_embeddings"] = "output.weight" not in model.tensors  # llama.cpp writes it only untied
    config["attention_bias"] = "blk.0.attn_q.bias" in model.tensors
    config["mlp_bias"] = "blk.0.ffn_up.bias" in model.tensors
    config["hidden_act"] = "silu"
    rotary = model.arch_key("rope.dimension_count")
    if rotary is not None and rotary != config["head_dim"]:
        config["partial_rotary_factor"] = rotary / config["head_dim"]
    scaling = rope_scaling(model)
    if scaling:
        config["rope_scaling"] = scaling
    meta = model.metadata
    config["eos_token_id"] = sorted(end_of_generation_ids(model))
    for name, key in (("bos_token_id", "bos_token_id"), ("pad_token_id", "padding_token_id")):
        if meta.get(f"tokenizer.ggml.{key}") is not None:
            config[name] = int(meta[f"tokenizer.ggml.{key}"])
    config.update(arch.fixed)
    if arch.adjust is not None:
        arch.adjust(config, model)
    return config


def vocab_size(model: GGUFModel) -> int:
    """The embedding's rows (what the weights need), else the metadata's count."""
    embedding = model.tensors.get("token_embd.weight")
    if embedding is not None and len(embedding.dims) == 2:
        return int(embedding.dims[1])
    count = model.arch_key("vocab_size") or len(model.metadata.get("tokenizer.ggml.tokens", ()))
    if not count:
        raise GGUFError(f"{model.path} states no vocabulary size (no token_embd.weight, no tokens)")
    return int(count)


def end_of_generation_ids(model: GGUFModel) -> set[int]:
    """The ids llama.cpp stops on: the file's eos, eot and eom ids, and tokens of the texts above."""
    meta = model.metadata
    ids = {
        int(meta[f"tokenizer.ggml.{k}_token_id"])
        for k in ("eos", "eot", "eom")
        if f"tokenizer.ggml.{k}_token_id" in meta
    }
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        ids |= {i for i, text in enumerate(tokens) if text in END_OF_GENERATION_TEXTS}
    return ids


def rope_scaling(model: GGUFModel) -> dict[str, Any] | None:
    """`rope_scaling` as config.json spells it, from `{arch}.rope.scaling.*` or a rope_freqs tensor."""
    kind = model.arch_key("rope.scaling.type")
    factor = model.arch_key("rope.scaling.factor")
    original = model.arch_key("rope.scaling.original_context_length")
    freqs = model.tensors.get("rope_freqs.weight")
    if freqs is not None:
        # Llama 3.1's scaling, which llama.cpp stores as one divisor per rotary frequency.
        values = np.memmap(freqs.file, dtype="<f4", mode="r", offset=freqs.start, shape=(freqs.nbytes // 4,))
        return {"rope_type": "default", "freq_factors": [float(v) for v in values]}
    if kind in (None, "none") or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        scaling: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor)}
        if original is not None:
            scaling["original_max_position_embeddings"] = int(original)
        for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if model.arch_key(f"rope.scaling.{key}") is not None:
                scaling[name] = float(model.arch_key(f"rope.scaling.{key}"))
        return scaling
    return {"rope_type": str(kind), "factor": factor}  # the worker names what it does not run


def _checked(model: GGUFModel, key: str, value: Any, real: bool) -> Any:
    """A count must be a positive integer, a real number a positive one (a hand-edited or corrupt
    file would otherwise fail later, in shapes, far from the key that caused it)."""
    kinds = (int, float, np.integer, np.floating) if real else (int, np.integer)
    if isinstance(value, kinds) and not isinstance(value, bool) and value > 0:
        return float(value) if real else int(value)
    expected = "a positive number" if real else "a positive integer"
    raise GGUFError(f"{model.path}: {model.architecture}.{key} is {value!r}; expected {expected}")


def _one_value(model: GGUFModel, key: str, value: Any) -> Any:
    """A per-layer array of one repeated value is that value; differing per-layer values are not
    something these architectures have."""
    if not isinstance(value, list):
        return value
    if value and all(v == value[0] for v in value):
        return value[0]
    raise GGUFError(
        f"{model.path}: {model.architecture}.{key} differs per layer ({value[:8]}...), not supported"
    )
