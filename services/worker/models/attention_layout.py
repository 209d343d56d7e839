"""Per layer, how a model attends: which layers slide over a window (and how wide), and which rotary
each uses; read from config.json the way transformers reads it for each family.

A layer's window is exact in every attention backend (kernels/attention.py, AttentionRules), so the
served context is the model's positions whatever its windows (services/checkpoint.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pagedserve.services.worker.layers.rope import RopeConfig

SLIDING, FULL = "sliding_attention", "full_attention"

Windows = tuple[int | None, ...]  # per layer: the window, or None for full causal attention
WindowLayout = Callable[[dict[str, Any]], Windows]
RopeLayout = Callable[[dict[str, Any]], tuple[RopeConfig, RopeConfig | None]]


def _size(hf: dict[str, Any]) -> int | None:
    window = hf.get("sliding_window")
    return int(window) if window else None


def _by_type(hf: dict[str, Any], default: Callable[[int], bool]) -> Windows:
    """The config's `layer_types` when it has them, else `default(i)` says which layers slide."""
    size, layers = _size(hf), int(hf["num_hidden_layers"])
    types = hf.get("layer_types") or [SLIDING if default(i) else FULL for i in range(layers)]
    if len(types) != layers:
        raise ValueError(f"layer_types has {len(types)} entries; the model has {layers} layers")
    unknown = sorted(set(types) - {SLIDING, FULL})
    if unknown:
        raise ValueError(f"layer_types {unknown} are not supported; supported: {SLIDING}, {FULL}")
    return tuple(size if t == SLIDING else None for t in types)


def no_windows(hf: dict[str, Any]) -> Windows:
    """Llama: full causal attention in every layer."""
    return (None,) * int(hf["num_hidden_layers"])


def every_layer(hf: dict[str, Any]) -> Windows:
    """Mistral, Phi-3: `sliding_window`, when set, in every layer (transformers' one mask for all)."""
    return (_size(hf),) * int(hf["num_hidden_layers"])


def qwen_layers(hf: dict[str, Any]) -> Windows:
    """Qwen2/Qwen3: no window unless `use_sliding_window`; then layers from `max_window_layers` on
    slide (or as `layer_types` says)."""
    if not hf.get("use_sliding_window", False):
        return no_windows(hf)
    first = int(hf.get("max_window_layers", 28))
    return _by_type(hf, lambda i: i >= first)


def gemma2_layers(hf: dict[str, Any]) -> Windows:
    """Gemma 2: every other layer slides, the first one included."""
    return _by_type(hf, lambda i: (i + 1) % 2 == 1)


def gemma3_layers(hf: dict[str, Any]) -> Windows:
    """Gemma 3: `sliding_window_pattern` - 1 sliding layers, then a global one (5 to 1 by default)."""
    pattern = int(hf.get("sliding_window_pattern", 6))
    return _by_type(hf, lambda i: (i + 1) % pattern != 0)


def one_rope(hf: dict[str, Any]) -> tuple[RopeConfig, RopeConfig | None]:
    """One rotary for every layer."""
    return RopeConfig.from_hf(hf), None


def phi3_rope(hf: dict[str, Any]) -> tuple[RopeConfig, RopeConfig | None]:
    """Phi-3's older configs call LongRoPE `su` (and some `yarn`): transformers reads both as longrope."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    kind = params.get("rope_type") or params.get("type")
    if kind in ("su", "yarn"):
        params.pop("type", None)
        params["rope_type"] = "longrope"
    return RopeConfig.from_hf(hf, params), None


def gemma3_ropes(hf: dict[str, Any]) -> tuple[RopeConfig, RopeConfig | None]:
    """Gemma 3: global layers rotate with `rope_theta` (1e6 by default) and any `rope_scaling`; sliding
    layers with `rope_local_base_freq` (1e4), unscaled. transformers 5 writes both under
    `rope_parameters`, keyed by layer type."""
    nested = hf.get("rope_parameters") or {}
    if FULL in nested or SLIDING in nested:
        full = RopeConfig.from_hf({**hf, "rope_theta": 1_000_000.0}, nested.get(FULL) or {})
        local = RopeConfig.from_hf({**hf, "rope_theta": 10_000.0}, nested.get(SLIDING) or {})
        return full, local
    full = RopeConfig.from_hf({"rope_theta": 1_000_000.0, **hf}, hf.get("rope_scaling") or {})
    local = RopeConfig.from_hf({**hf, "rope_theta": float(hf.get("rope_local_base_freq", 10_000.0))}, {})
    return full, local
