"""Sampled frequencies follow the exact distribution of each rule (chi-square), on both backends and
both logit dtypes; and both backends draw the same token for the same seed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pagedserve.services.worker.sampler import Sampler, SamplingRequest
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import WorkerSampling

# Distinct logits, and no rule's cut within 1% of a token's boundary (checked below), so the kept set
# is the same whatever the float rounding.
LOGITS = torch.tensor([2.1, -0.4, 0.9, 3.0, -1.7, 0.2, 1.6, -2.9, 2.5, -0.9, 0.6, 1.2])
DRAWS = 20_000
RULES: dict[str, dict[str, Any]] = {
    "temperature": {"temperature": 0.6},
    "hot temperature": {"temperature": 2.5},
    "top_k": {"temperature": 0.8, "top_k": 3},
    "top_p": {"temperature": 0.8, "top_p": 0.85},
    "top_k and top_p": {"temperature": 1.3, "top_k": 6, "top_p": 0.7},
    "min_p": {"temperature": 1.0, "min_p": 0.15},
    "all three": {"temperature": 1.1, "top_k": 8, "top_p": 0.9, "min_p": 0.1},
}


def exact_distribution(logits: torch.Tensor, params: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """The rules written out plainly over a sorted row, in float64 -> (probabilities, the smallest
    distance of any cut from a token's boundary)."""
    scaled = logits.double() / params["temperature"]
    probs = scaled.softmax(0)
    order = probs.argsort(descending=True)
    kept = torch.ones_like(probs, dtype=torch.bool)
    margin = 1.0
    top_k = params.get("top_k", 0)
    if top_k:
        kept[order[top_k:]] = False
    top_p = params.get("top_p", 1.0)
    if top_p < 1.0:
        renormalised = (probs * kept)[order] / (probs * kept).sum()
        mass_before = renormalised.cumsum(0) - renormalised
        kept[order[mass_before >= top_p]] = False
        margin = min(margin, float((mass_before[kept[order]] - top_p).abs().min()))
        margin = min(margin, float((mass_before[~kept[order]] - top_p).abs().min()))
    min_p = params.get("min_p", 0.0)
    if min_p > 0.0:
        share = probs / probs.max()
        kept &= share >= min_p
        margin = min(margin, float((share - min_p).abs().min()))
    distribution = probs * kept
    return distribution / distribution.sum(), margin


def chi_square_p_value(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """P(X >= statistic) for X ~ chi-square with (kept tokens - 1) degrees of freedom."""
    kept = expected > 0
    statistic = ((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum()
    degrees = int(kept.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2.0), statistic / 2.0))


def seeded_requests(params: dict[str, Any], rows: int) -> list[SamplingRequest]:
    """One request per row, row i with seed i: the draws are reproducible, so is the test."""
    fields = SamplingParams(**params)
    return [SamplingRequest(WorkerSampling.of(fields, i), [0], []) for i in range(rows)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("rule", list(RULES))
def test_sampled_frequencies_follow_the_exact_distribution(
    backend: str, rule: str, dtype: torch.dtype
) -> None:
    params = RULES[rule]
    logits = LOGITS.to(dtype)
    expected, margin = exact_distribution(logits, params)
    assert margin > 0.01  # the rule's cut is well inside a gap, so rounding cannot move it
    sampler = Sampler(len(LOGITS), eos_token_ids=[], backend=backend)
    tokens, _ = sampler.sample(logits.expand(DRAWS, -1), seeded_requests(params, DRAWS))
    counts = torch.bincount(torch.tensor(tokens), minlength=len(LOGITS)).double()
    assert (counts[expected == 0] == 0).all(), "a token outside the kept set was drawn"
    assert chi_square_p_value(counts, expected * DRAWS) > 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_both_backends_draw_the_same_token_for_the_same_seed(dtype: torch.dtype) -> None:
    vocab, rows = 3000, 256
    logits = (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(7)) * 3).to(dtype)
    samplers = [Sampler(vocab, eos_token_ids=[], backend=b) for b in ("torch", "cpp")]
    for params in [{"temperature": 0.6}, *RULES.values(), {"temperature": 1.0, "top_p": 0.95, "top_k": 300}]:
        requests = seeded_requests(params, rows)
        torch_tokens, cpp_tokens = (sampler.sample(logits, requests)[0] for sampler in samplers)
        assert cpp_tokens == torch_tokens, params
