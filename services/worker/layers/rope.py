"""Rotary position embeddings: inverse frequencies for each rope_scaling type, and their application.

The rotation pairs dimension i with i + head_dim/2 (the "rotate half" layout Hugging Face checkpoints
are trained with), not adjacent dimensions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    rope_type: str
    theta: float
    params: dict[str, Any] = field(default_factory=dict)  # the rest of rope_scaling / rope_parameters

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> RopeConfig:
        """Read both spellings: `rope_theta` + `rope_scaling` (most checkpoints) and transformers 5's
        `rope_parameters` (which carries the theta inside)."""
        params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
        params.pop("type", None)
        theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"rope type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
        if partial != 1.0:
            raise ValueError(f"partial_rotary_factor={partial} is not supported (only 1.0)")
        return cls(rope_type, theta, params)


def inverse_frequencies(
    rope: RopeConfig, head_dim: int, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """-> (inv_freq [head_dim/2] float32, attention factor applied to cos and sin)."""
    # Computed the way the checkpoints' reference code does (int64 arange, float32), so fp32 logits match.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    base = 1.0 / (rope.theta**exponents)
    p = rope.params
    if p.get("freq_factors") is not None:
        # A GGUF's rope_freqs tensor (Llama 3.1's scaling as llama.cpp stores it): one divisor per
        # frequency, applied to the rotation of every position (services/gguf_config.py).
        factors = torch.tensor(p["freq_factors"], dtype=torch.float32)
        if factors.shape != base.shape:
            raise ValueError(
                f"rope freq_factors has {factors.numel()} values; head_dim {head_dim} needs {base.numel()}"
            )
        return base / factors, 1.0
    if rope.rope_type == "default":
        return base, 1.0
    if rope.rope_type == "dynamic":
        # Dynamic NTK changes nothing up to max_position_embeddings, and the worker never serves
        # longer contexts (max_model_len is capped there), so it is the default rotation.
        return base, 1.0
    if rope.rope_type == "linear":
        return base / p["factor"], 1.0
    if rope.rope_type == "llama3":
        return _llama3(base, p), 1.0
    return _yarn(rope, head_dim, max_position_embeddings)


def _llama3(inv_freq: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend in between."""
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, blended, scaled)


def _yarn(rope: RopeConfig, head_dim: int, max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate low frequencies, keep high ones, ramp between; scale attention by mscale."""
    p = rope.params
    original = p.get("original_max_position_embeddings") or max_position_embeddings
    factor = p.get("factor") or max_position_embeddings / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            attention_factor = mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def dim_for_rotations(rotations: float) -> float:
        # The dimension whose wavelength fits `rotations` times into the original context.
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = dim_for_rotations(beta_fast), dim_for_rotations(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    powers = rope.theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    extrapolated, interpolated = 1.0 / powers, 1.0 / (factor * powers)
    keep = 1 - ramp  # 1 where the frequency is high enough to keep as trained
    return interpolated * (1 - keep) + extrapolated * keep, float(attention_factor)


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, rope: RopeConfig, head_dim: int, max_position_embeddings: int) -> None:
        super().__init__()
        # A plain attribute, not a buffer: the model may be built on the meta device (no weights
        # allocated before loading), and these frequencies must exist for real.
        with torch.device("cpu"):
            self.inv_freq, self.attention_factor = inverse_frequencies(
                rope, head_dim, max_position_embeddings
            )

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Once per step, shared by every layer -> cos, sin [T, 1, head_dim/2] in the model dtype."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim] -> rotated copy."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
