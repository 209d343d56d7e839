"""Gemma 2, Gemma 3 and Phi-3 / Phi-4 GGUF metadata -> config.json fields, as llama.cpp reads them.

services/gguf_config.py renames the keys every architecture shares; these families need more, and
llama.cpp hard-codes some of it rather than storing it (src/models/gemma2.cpp, gemma3.cpp, phi3.cpp of
llama.cpp). What each function here reads, and what llama.cpp assumes when a key is absent:

- Gemma 2/3: the attention scale is 1/sqrt(head_dim), except for the 27B models (46 layers for Gemma 2,
  62 for Gemma 3), where it is 1/sqrt(hidden / heads): transformers' `query_pre_attn_scalar`, which
  the converter does not write. Which layers slide: `{arch}.attention.sliding_window_pattern` (a count
  n: layer i slides where i % n < n - 1; or one bool per layer), else n = 2 (Gemma 2) or 6 (Gemma 3);
  a Gemma 3 file without `attention.sliding_window` has no sliding layer at all. Sliding layers rotate
  with `rope.freq_base_swa` (Gemma 3: 10000 when absent, unscaled), global ones with `rope.freq_base`
  (10000 when absent) and `rope.scaling.*`. The norms of a converted file already hold 1 + w
  (gguf_weights.UNIT_OFFSET_STORED tells the loader not to add the 1 again).
- Phi-3: `attention.sliding_window` 0 means none (Phi-4); LongRoPE is a pair of tensors,
  `rope_factors_long.weight` / `rope_factors_short.weight`, with `rope.scaling.original_context_length`
  (required then) and `rope.scaling.attn_factor` (transformers' default value is recomputed, so the
  rotation is bit-identical to the folder's; a value that differs from it is passed on).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pagedserve.services.gguf_file import GGUFError, GGUFModel

SLIDING, FULL = "sliding_attention", "full_attention"
# llama.cpp's default sliding pattern per architecture, and the layer counts of its 27B models.
_DEFAULT_PATTERN = {"gemma2": 2, "gemma3": 6}
_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _positive(model: GGUFModel, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or value <= 0:
        raise GGUFError(f"{model.path}: {model.architecture}.{key} is {value!r}; expected a positive number")
    return float(value)


def _layer_types(model: GGUFModel, layers: int) -> list[str]:
    pattern = model.arch_key("attention.sliding_window_pattern", _DEFAULT_PATTERN[model.architecture])
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise GGUFError(
                f"{model.path}: {model.architecture}.attention.sliding_window_pattern has "
                f"{len(pattern)} entries; the model has {layers} layers"
            )
        return [SLIDING if bool(s) else FULL for s in pattern]
    n = int(pattern)
    if n < 0:
        raise GGUFError(f"{model.path}: {model.architecture}.attention.sliding_window_pattern is {n}")
    # llama.cpp's set_swa_pattern: n == 0 makes every layer slide
    return [SLIDING if n == 0 or i % n < n - 1 else FULL for i in range(layers)]


def gemma(config: dict[str, Any], model: GGUFModel) -> None:
    arch, layers = model.architecture, config["num_hidden_layers"]
    config["hidden_act"] = config["hidden_activation"] = "gelu_pytorch_tanh"
    config.setdefault("rope_theta", 10_000.0)
    head_dim, heads = config["head_dim"], config["num_attention_heads"]
    config["query_pre_attn_scalar"] = (
        config["hidden_size"] // heads if layers == _27B_LAYERS[arch] else head_dim
    )
    window = model.arch_key("attention.sliding_window")
    if arch == "gemma3" and not window:
        config["sliding_window"] = None
        config["layer_types"] = [FULL] * layers
        return
    config["sliding_window"] = int(_positive(model, "attention.sliding_window", window or 4096))
    config["layer_types"] = _layer_types(model, layers)
    local_base = model.arch_key("rope.freq_base_swa")
    if arch == "gemma3":
        config["rope_local_base_freq"] = (
            10_000.0 if local_base is None else _positive(model, "rope.freq_base_swa", local_base)
        )
    elif local_base is not None and float(local_base) != config["rope_theta"]:
        raise GGUFError(
            f"{model.path}: gemma2.rope.freq_base_swa ({local_base}) differs from rope.freq_base "
            f"({config['rope_theta']}); Gemma 2 has one rotary base"
        )


def _tensor_values(model: GGUFModel, name: str) -> list[float]:
    info = model.tensors[name]
    if info.type_id != 0:  # GGML F32, as llama.cpp's converter writes these factors
        raise GGUFError(f"{model.path}: {name} must be F32 (type 0); it is type {info.type_id}")
    values = np.memmap(info.file, dtype="<f4", mode="r", offset=info.start, shape=(info.nbytes // 4,))
    return [float(v) for v in values]


def phi3(config: dict[str, Any], model: GGUFModel) -> None:
    window = model.arch_key("attention.sliding_window")
    config["sliding_window"] = int(_positive(model, "attention.sliding_window", window)) if window else None
    long_name, short_name = "rope_factors_long.weight", "rope_factors_short.weight"
    present = [n for n in (long_name, short_name) if n in model.tensors]
    if not present:
        return
    if len(present) == 1:
        raise GGUFError(f"{model.path} holds {present[0]} without its pair (LongRoPE needs both)")
    original = model.arch_key("rope.scaling.original_context_length")
    if original is None:
        raise GGUFError(
            f"{model.path} lacks metadata the model needs: phi3.rope.scaling.original_context_length "
            "(LongRoPE factors are present)"
        )
    original = int(_positive(model, "rope.scaling.original_context_length", original))
    long, short = _tensor_values(model, long_name), _tensor_values(model, short_name)
    rotary = round(config["head_dim"] * config.get("partial_rotary_factor", 1.0))
    if len(long) != rotary // 2 or len(short) != rotary // 2:
        raise GGUFError(
            f"{model.path}: LongRoPE factors have {len(long)} / {len(short)} values; "
            f"{rotary} rotary dimensions need {rotary // 2}"
        )
    scaling: dict[str, Any] = {"rope_type": "longrope", "short_factor": short, "long_factor": long}
    scale = config["max_position_embeddings"] / original
    default = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
    stored = model.arch_key("rope.scaling.attn_factor")
    if stored is not None and not math.isclose(float(stored), default, rel_tol=1e-6):
        scaling["attention_factor"] = float(stored)
    config["original_max_position_embeddings"] = original
    config["rope_scaling"] = scaling
