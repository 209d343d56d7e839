"""Verifying proposed tokens: the target samples every scored position, and a proposal stands while the
target's own token there equals it.

A decode at position s with proposals d1..dp is scored at s..s+p in one forward. Row j is sampled
exactly as a step without speculation would sample position s+j had d1..dj been generated: its
penalties and min_tokens see them, its grammar mask is the matcher's state after them, and a seeded
row draws its uniform for its own output position (sampler.py: seed, position). The first row whose
token differs from the proposal ends the run: that token is the step's last.

Proposers are deterministic (their distribution q is one-hot at the proposal), so this is rejection
sampling exactly (Leviathan et al. 2023, with q one-hot): a proposal d is kept with probability p(d),
and on rejection the token drawn is distributed as p without d, renormalised, which is the residual
(p - q)+. Each emitted token therefore has the target distribution, and with a seed the very token that
decoding without speculation would produce; greedy rows keep only proposals equal to the argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagedserve.services.worker.packed_batch import RequestState
from pagedserve.services.worker.sampler import SamplingRequest


@dataclass(slots=True)
class ScoredRequest:
    """A request that samples in this step, and the tokens proposed after its input (maybe none)."""

    state: RequestState
    proposed: list[int]
    first_row: int  # its first row of logits (1 + len(proposed) rows in all)


def sampling_rows(scored: Sequence[ScoredRequest]) -> list[SamplingRequest]:
    """One SamplingRequest per logits row: row j of a request sees its outputs and its first j proposals."""
    rows: list[SamplingRequest] = []
    for item in scored:
        s = item.state
        rows.append(SamplingRequest(s.sampling, s.prompt_token_ids, s.output_token_ids))
        for j in range(1, len(item.proposed) + 1):
            rows.append(
                SamplingRequest(s.sampling, s.prompt_token_ids, s.output_token_ids + item.proposed[:j])
            )
    return rows


def accepted_run(sampled: Sequence[int], proposed: Sequence[int]) -> int:
    """How many leading proposals the target's own tokens reproduce (sampled has one row more)."""
    m = 0
    while m < len(proposed) and sampled[m] == proposed[m]:
        m += 1
    return m
