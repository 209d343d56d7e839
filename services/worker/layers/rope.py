"""Rotary position embeddings: inverse frequencies for each rope_scaling type, and their application.

The rotation pairs dimension i with i + rotary_dim/2 (the "rotate half" layout Hugging Face checkpoints
are trained with), not adjacent dimensions. A partial rotary (`partial_rotary_factor`, Phi-4-mini's
0.75) rotates the first rotary_dim dimensions of each head and leaves the rest as they are.

LongRoPE (Phi-3 / Phi-4) has two sets of frequencies, `short_factor` and `long_factor`. Transformers
picks one per forward call: long when the call's highest position + 1 exceeds
`original_max_position_embeddings`, for every position of that call. Under `generate` a prompt is one
call and each decoded token one more, so token p of a request with a P-token prompt was rotated with
the long set exactly when P > original or p >= original. We apply that rule per token (`long_tokens`),
which gives each token the rotation transformers gives it, however the prompt is chunked, batched,
preempted and recomputed. The rotation of a cached K depends on its request's prompt length, so the
prefix cache keys LongRoPE requests with prompts past the original length apart (docs/architectures-gemma-phi.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
# Types whose original context transformers takes from a top-level `original_max_position_embeddings`
# before the one inside the parameters (Phi-3 keeps it there).
_ORIGINAL_LENGTH_TYPES = ("llama3", "yarn", "longrope")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    rope_type: str
    theta: float
    params: dict[str, Any] = field(default_factory=dict)  # the rest of rope_scaling / rope_parameters
    partial: float = 1.0  # the fraction of each head rotated (partial_rotary_factor)

    @classmethod
    def from_hf(cls, hf: dict[str, Any], params: dict[str, Any] | None = None) -> RopeConfig:
        """Read both spellings: `rope_theta` + `rope_scaling` (most checkpoints) and transformers 5's
        `rope_parameters` (which carries the theta inside). `params`: one layer type's parameters
        where the config has several (Gemma 3), read the same way."""
        given = (hf.get("rope_parameters") or hf.get("rope_scaling") or {}) if params is None else params
        params = {**given}  # a copy: the pops below must not reach the caller's config
        rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
        params.pop("type", None)
        theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"rope type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        partial = float(params.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
        if not 0.0 < partial <= 1.0:
            raise ValueError(f"partial_rotary_factor must be in (0, 1]; got {partial}")
        if rope_type in _ORIGINAL_LENGTH_TYPES and hf.get("original_max_position_embeddings"):
            params["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
        if rope_type == "longrope":
            for key in ("short_factor", "long_factor"):
                if not isinstance(params.get(key), list):
                    raise ValueError(f"longrope needs rope_scaling.{key}, a list of numbers")
            params.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings", 2048))
        return cls(rope_type, theta, params, partial)

    def rotary_dim(self, head_dim: int) -> int:
        """How many dimensions of each head rotate (transformers: int(head_dim * partial_rotary_factor))."""
        return int(head_dim * self.partial)

    @property
    def long_from(self) -> int | None:
        """LongRoPE: the original context length past which the long factors apply; else None."""
        return int(self.params["original_max_position_embeddings"]) if self.rope_type == "longrope" else None


def inverse_frequencies(
    rope: RopeConfig, head_dim: int, max_position_embeddings: int, *, long: bool = False
) -> tuple[torch.Tensor, float]:
    """-> (inv_freq [head_dim/2] float32, attention factor applied to cos and sin). `head_dim`: the
    rotated dimensions (rotary_dim); `long`: LongRoPE's long factors instead of its short ones."""
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
    if rope.rope_type == "longrope":
        return _longrope(rope, exponents, max_position_embeddings, long)
    if rope.rope_type == "dynamic":
        # Dynamic NTK changes nothing up to max_position_embeddings, and the worker never serves
        # longer contexts (max_model_len is capped there), so it is the default rotation.
        return base, 1.0
    if rope.rope_type == "linear":
        return base / p["factor"], 1.0
    if rope.rope_type == "llama3":
        return _llama3(base, p), 1.0
    return _yarn(rope, head_dim, max_position_embeddings)


def _longrope(
    rope: RopeConfig, exponents: torch.Tensor, max_position_embeddings: int, long: bool
) -> tuple[torch.Tensor, float]:
    """LongRoPE: each frequency divided by its own factor (short or long set); attention scaled by
    sqrt(1 + ln(factor) / ln(original)), factor = max positions / original unless given."""
    p = rope.params
    original = int(p["original_max_position_embeddings"])
    factors = p["long_factor" if long else "short_factor"]
    if len(factors) != exponents.numel():
        raise ValueError(
            f"longrope {'long' if long else 'short'}_factor has {len(factors)} values; the rotary "
            f"dimensions need {exponents.numel()} (rotary_dim / 2)"
        )
    factor = p.get("factor") or max_position_embeddings / original
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = torch.tensor(factors, dtype=torch.float32)
    return 1.0 / (ext * rope.theta**exponents), float(attention_factor)


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
        self.rotary_dim = rope.rotary_dim(head_dim)
        self.long_from = rope.long_from
        # Plain attributes, not buffers: the model may be built on the meta device (no weights
        # allocated before loading), and these frequencies must exist for real.
        with torch.device("cpu"):
            self.inv_freq, self.attention_factor = inverse_frequencies(
                rope, self.rotary_dim, max_position_embeddings
            )
            self.long_inv_freq: torch.Tensor | None = None
            if self.long_from is not None:
                self.long_inv_freq, _ = inverse_frequencies(
                    rope, self.rotary_dim, max_position_embeddings, long=True
                )

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype, long_tokens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Once per step, shared by every layer -> cos, sin [T, 1, rotary_dim/2] in the model dtype.
        long_tokens [T] bool: LongRoPE's long factors for those tokens (see the module's docstring)."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
            if self.long_inv_freq is not None:
                self.long_inv_freq = self.long_inv_freq.to(positions.device)
        inv_freq = self.inv_freq[None, :]
        if self.long_inv_freq is not None and long_tokens is not None:
            inv_freq = torch.where(long_tokens[:, None], self.long_inv_freq[None, :], inv_freq)
        freqs = positions[:, None].float() * inv_freq
        cos, sin = freqs.cos(), freqs.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim] -> rotated copy."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def longrope_tokens(
    positions: torch.Tensor, prompt_lens: list[int], query_lens: list[int], long_from: int
) -> torch.Tensor:
    """[T] bool: the packed tokens LongRoPE rotates with its long factors: every token of a request
    whose prompt is longer than `long_from`, and any token at position >= long_from (request r has
    query_lens[r] tokens in the packed batch, its prompt prompt_lens[r] tokens)."""
    long_prompt = torch.tensor([p > long_from for p in prompt_lens], device=positions.device)
    per_token = long_prompt.repeat_interleave(torch.tensor(query_lens, device=positions.device))
    return per_token | (positions >= long_from)
