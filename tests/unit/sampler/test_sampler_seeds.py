"""Greedy is the argmax; a seed fixes the tokens, whatever else shares the batch."""

from __future__ import annotations

import torch
from sampling_requests import make_request

from pagedserve.services.worker.sampler import Sampler

VOCAB = 1000


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def test_greedy_is_the_argmax(backend: str) -> None:
    logits = _logits(16)
    tokens, logprobs = Sampler(VOCAB, eos_token_ids=[], backend=backend).sample(
        logits, [make_request(temperature=0.0)] * 16
    )
    assert tokens == logits.argmax(dim=1).tolist()
    assert logprobs is None


def test_greedy_ignores_truncation_and_seed(backend: str) -> None:
    logits = _logits(4)
    request = make_request(temperature=0.0, top_k=5, top_p=0.5, min_p=0.3, seed=7)
    tokens, _ = Sampler(VOCAB, eos_token_ids=[], backend=backend).sample(logits, [request] * 4)
    assert tokens == logits.argmax(dim=1).tolist()


def test_greedy_works_on_bfloat16_logits_with_a_padded_vocab(backend: str) -> None:
    logits = _logits(3).to(torch.bfloat16)
    padded = torch.cat([logits, torch.full((3, 24), 100.0, dtype=torch.bfloat16)], dim=1)
    tokens, _ = Sampler(VOCAB, eos_token_ids=[], backend=backend).sample(
        padded, [make_request(temperature=0.0)] * 3
    )
    assert tokens == logits.argmax(dim=1).tolist()


def test_a_seed_gives_the_same_tokens_alone_and_inside_a_batch(backend: str) -> None:
    sampler = Sampler(VOCAB, eos_token_ids=[], backend=backend)
    row = _logits(1, seed=1)
    seeded = [make_request(temperature=1.0, top_p=0.95, seed=42, output=[0] * n) for n in range(20)]
    alone = [sampler.sample(row, [r])[0][0] for r in seeded]

    others = _logits(7, seed=2)
    in_batch = []
    for n, request in enumerate(seeded):
        # Each step a different crowd: other seeds, unseeded rows, greedy rows, another top-k.
        crowd = [
            make_request(temperature=0.7, seed=n),
            make_request(temperature=1.0),
            make_request(temperature=0.0),
            make_request(temperature=1.3, top_k=3),
        ]
        logits = torch.cat([others[: n % 4], row, others[n % 4 : 4]])
        requests = crowd[: n % 4] + [request] + crowd[n % 4 :]
        in_batch.append(sampler.sample(logits, requests)[0][n % 4])
    assert in_batch == alone
    assert len(set(alone)) > 5  # it really samples


def test_a_seed_repeats_its_tokens_after_recompute(backend: str) -> None:
    logits = _logits(1)
    request = make_request(temperature=1.0, seed=3, output=[5, 6, 7])
    first = Sampler(VOCAB, eos_token_ids=[], backend=backend).sample(logits, [request])[0]
    again = Sampler(VOCAB, eos_token_ids=[], backend=backend).sample(logits, [request])[0]  # a fresh worker
    assert first == again


def test_different_seeds_give_different_tokens(backend: str) -> None:
    logits = _logits(1).expand(64, -1)
    tokens, _ = Sampler(VOCAB, eos_token_ids=[], backend=backend).sample(
        logits, [make_request(temperature=1.0, seed=s) for s in range(64)]
    )
    assert len(set(tokens)) > 40


def test_a_seed_draws_a_new_token_at_each_position(backend: str) -> None:
    logits = _logits(1)
    sampler = Sampler(VOCAB, eos_token_ids=[], backend=backend)
    tokens = [
        sampler.sample(logits, [make_request(temperature=1.0, seed=9, output=[0] * n)])[0][0]
        for n in range(32)
    ]
    assert len(set(tokens)) > 20
