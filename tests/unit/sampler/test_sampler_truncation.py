"""Top-k, top-p and min-p: whatever the draw, the sampled token is inside the kept set."""

from __future__ import annotations

from collections.abc import Callable

import torch
from sampling_requests import make_request

from pagedserve.services.worker.sampler import Sampler, SamplingRequest

DRAWS = 2000


def _draw_many(
    backend: str,
    logits_row: torch.Tensor,
    request_for_row: Callable[[int], SamplingRequest],
    rows: int = DRAWS,
) -> torch.Tensor:
    sampler = Sampler(logits_row.shape[0], eos_token_ids=[], backend=backend)
    requests = [request_for_row(i) for i in range(rows)]
    tokens, _ = sampler.sample(logits_row.expand(rows, -1).clone(), requests)
    return torch.tensor(tokens)


def _nucleus(logits: torch.Tensor, top_p: float) -> set[int]:
    probs, order = logits.softmax(0).sort(descending=True)
    mass_before = probs.cumsum(0) - probs
    return set(order[mass_before < top_p].tolist())


def test_top_k_never_samples_outside_the_k_best(backend: str) -> None:
    logits = torch.randn(64, generator=torch.Generator().manual_seed(1))
    ks = [1, 3, 10]
    tokens = _draw_many(backend, logits, lambda i: make_request(temperature=1.5, top_k=ks[i % 3]))
    for i, token in enumerate(tokens.tolist()):
        assert token in set(logits.topk(ks[i % 3]).indices.tolist())
    assert len(set(tokens[2::3].tolist())) == 10  # and it does sample among all of them


def test_top_p_never_samples_outside_the_nucleus(backend: str) -> None:
    logits = torch.randn(64, generator=torch.Generator().manual_seed(2)) * 2
    nucleus = _nucleus(logits, 0.7)
    tokens = _draw_many(backend, logits, lambda i: make_request(temperature=1.0, top_p=0.7))
    assert set(tokens.tolist()) == nucleus


def test_top_p_with_a_nucleus_wider_than_the_first_candidates(backend: str) -> None:
    # A flat distribution over 6000 tokens: the nucleus (~5400 tokens) is only found by the full sort.
    logits = torch.randn(6000, generator=torch.Generator().manual_seed(3)) * 0.1
    nucleus = _nucleus(logits, 0.9)
    assert len(nucleus) > 4096
    tokens = _draw_many(backend, logits, lambda i: make_request(temperature=1.0, top_p=0.9), rows=500)
    assert set(tokens.tolist()) <= nucleus


def test_top_p_applies_to_the_top_k_renormalised_distribution(backend: str) -> None:
    logits = torch.tensor([3.0, 2.9, 2.8, 0.0, -1.0])
    # Within the top 2, token 0 holds ~52.5%: top_p 0.5 keeps it alone.
    tokens = _draw_many(
        backend, logits, lambda i: make_request(temperature=1.0, top_k=2, top_p=0.5), rows=200
    )
    assert set(tokens.tolist()) == {0}


def test_min_p_never_samples_below_its_share_of_the_best(backend: str) -> None:
    logits = torch.randn(64, generator=torch.Generator().manual_seed(4)) * 2
    temperature, min_p = 0.8, 0.2
    probs = (logits / temperature).softmax(0)
    tokens = _draw_many(backend, logits, lambda i: make_request(temperature=temperature, min_p=min_p))
    assert (probs[tokens] >= min_p * probs.max()).all()
    assert len(set(tokens.tolist())) == int((probs >= min_p * probs.max()).sum())


def test_rows_keep_their_own_truncation_in_a_mixed_batch(backend: str) -> None:
    logits = torch.randn(64, generator=torch.Generator().manual_seed(5))
    kinds = [
        lambda: make_request(temperature=1.0, top_k=2),
        lambda: make_request(temperature=1.0),
        lambda: make_request(temperature=1.0, min_p=0.9),
        lambda: make_request(temperature=0.0),
    ]
    tokens = _draw_many(backend, logits, lambda i: kinds[i % 4]())
    best = logits.argmax().item()
    assert set(tokens[0::4].tolist()) == set(logits.topk(2).indices.tolist())
    assert len(set(tokens[1::4].tolist())) > 30  # untouched: samples widely
    assert set(tokens[3::4].tolist()) == {best}


def test_sampled_frequencies_follow_the_tempered_distribution(backend: str) -> None:
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0])
    temperature = 2.0
    tokens = _draw_many(backend, logits, lambda i: make_request(temperature=temperature), rows=20000)
    observed = torch.bincount(tokens, minlength=4) / tokens.numel()
    expected = (logits / temperature).softmax(0)
    assert torch.allclose(observed, expected, atol=0.015)
