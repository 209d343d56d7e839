"""The per-row sampling parameters of one step, read once from the requests into index lists and tensors.

The sampler works on groups of rows (greedy, seeded, penalised, ...) so each group costs one tensor op,
not one op per row. This is the only place that walks the requests in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from pagedserve.shared.protocol.step import WorkerSampling

# Below this temperature a row is greedy: dividing by it would only overflow toward the argmax anyway.
GREEDY_TEMPERATURE = 1e-5


class SamplingRow(Protocol):
    params: WorkerSampling
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]


@dataclass(slots=True)
class SamplingBatch:
    num_rows: int
    greedy_rows: list[int] = field(default_factory=list)
    random_rows: list[int] = field(default_factory=list)  # temperature > 0
    temperatures: list[float] = field(default_factory=list)  # one per random row
    top_ks: list[int] = field(default_factory=list)  # one per random row, 0 = off
    top_ps: list[float] = field(default_factory=list)  # one per random row, 1.0 = off
    min_ps: list[float] = field(default_factory=list)  # one per random row, 0.0 = off
    seeds: list[int | None] = field(default_factory=list)  # one per random row
    positions: list[int] = field(default_factory=list)  # tokens generated so far, one per random row
    penalised_rows: list[int] = field(default_factory=list)
    banned: list[tuple[int, list[int]]] = field(default_factory=list)  # (row, token ids masked by min_tokens)
    biased: list[tuple[int, list[int], list[float]]] = field(default_factory=list)  # (row, ids, logit_bias)
    logprob_rows: list[int] = field(default_factory=list)
    num_logprobs: list[int] = field(default_factory=list)  # one per logprob row

    @property
    def any_truncation(self) -> bool:
        return any(k > 0 for k in self.top_ks) or any(p < 1.0 for p in self.top_ps)

    @property
    def any_min_p(self) -> bool:
        return any(p > 0.0 for p in self.min_ps)

    @property
    def is_plain_greedy(self) -> bool:
        """Every row greedy and nothing changes the logits: one argmax answers the whole step."""
        return not (
            self.random_rows or self.penalised_rows or self.banned or self.biased or self.logprob_rows
        )


def build_sampling_batch(
    requests: Sequence[SamplingRow], eos_token_ids: Sequence[int], vocab_size: int
) -> SamplingBatch:
    batch = SamplingBatch(num_rows=len(requests))
    for row, request in enumerate(requests):
        params = request.params
        num_output = len(request.output_token_ids)
        temperature = params.temperature
        if temperature < GREEDY_TEMPERATURE:
            batch.greedy_rows.append(row)
        else:
            batch.random_rows.append(row)
            batch.temperatures.append(temperature)
            batch.top_ks.append(params.top_k)
            batch.top_ps.append(params.top_p)
            batch.min_ps.append(params.min_p)
            batch.seeds.append(params.seed)
            batch.positions.append(num_output)
        if params.has_penalty:
            batch.penalised_rows.append(row)
        bias = params.logit_bias
        if bias:
            pairs = [(t, b) for t, b in bias.items() if 0 <= t < vocab_size]
            batch.biased.append((row, [t for t, _ in pairs], [b for _, b in pairs]))
        if num_output < params.min_tokens and params.structured_outputs is None:
            # ignore_eos does not lift this mask: min_tokens is a floor on length either way. A
            # constrained row is exempt: its grammar alone says when it may end (banning the only
            # token it allows would leave nothing to sample).
            stops = {*eos_token_ids, *params.stop_token_ids}
            batch.banned.append((row, sorted(t for t in stops if 0 <= t < vocab_size)))
        if params.logprobs is not None:
            batch.logprob_rows.append(row)
            batch.num_logprobs.append(params.logprobs)
    return batch


def column(values: Sequence[float | int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A per-row parameter as a [rows, 1] tensor that broadcasts over the vocabulary."""
    return torch.tensor(values, device=device, dtype=dtype).unsqueeze(1)
