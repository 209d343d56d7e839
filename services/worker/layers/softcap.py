"""Logit soft-capping (Gemma 2 and 3's final logits): x -> cap * tanh(x / cap), bounded by +-cap.

The attention scores' softcap is part of the attention kernels (kernels/attention.py, AttentionRules):
it must act before the softmax, inside the kernel's loop over the context."""

from __future__ import annotations

import torch


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """The same three ops, in the same order, as transformers applies them (so float32 bits match)."""
    return torch.tanh(x / cap) * cap
