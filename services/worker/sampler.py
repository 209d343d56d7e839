"""Token sampling for one packed step. (Interface stub: greedy only; the full sampler replaces the body.)

Seeded requests draw from a generator seeded by (seed, number of tokens generated so far), so a
seed gives the same tokens whatever else shares the batch, and across preemption and recompute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(slots=True)
class SamplingRequest:
    params: dict[str, Any]  # SamplingParams fields (shared.protocol.frontend.SamplingParams.model_dump())
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]


class Sampler:
    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)

    def sample(
        self, logits: torch.Tensor, requests: Sequence[SamplingRequest]
    ) -> tuple[list[int], list[Any] | None]:
        """logits [len(requests), vocab] (any float dtype) -> one token per row, and per-row logprobs
        (None for rows that did not ask; the whole list None when no row asked)."""
        return logits.argmax(dim=-1).tolist(), None
