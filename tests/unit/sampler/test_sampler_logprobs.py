"""Logprobs: the log-softmax after penalties and the stop mask, before temperature; top-n best first."""

from __future__ import annotations

import torch
from sampling_requests import make_request

from pagedserve.services.worker.sampler import Sampler

VOCAB = 50


def _logits(rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(0)) * 3


def test_logprobs_match_log_softmax_and_are_sorted(backend: str) -> None:
    logits = _logits(2)
    requests = [make_request(temperature=0.0, logprobs=5), make_request(temperature=0.6, top_k=4, logprobs=3)]
    tokens, logprobs = Sampler(VOCAB, eos_token_ids=[], backend=backend).sample(logits, requests)
    reference = logits.log_softmax(dim=1)  # temperature and top-k do not change what is reported
    assert logprobs is not None
    for row, (n, (sampled, top)) in enumerate(zip([5, 3], logprobs, strict=True)):
        assert sampled == reference[row, tokens[row]].item()
        assert [t for t, _ in top] == reference[row].topk(n).indices.tolist()
        assert [lp for _, lp in top] == reference[row].topk(n).values.tolist()
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)


def test_rows_that_did_not_ask_get_none(backend: str) -> None:
    requests = [make_request(temperature=0.0), make_request(temperature=0.0, logprobs=0)]
    tokens, logprobs = Sampler(VOCAB, eos_token_ids=[], backend=backend).sample(_logits(2), requests)
    assert logprobs is not None and logprobs[0] is None
    sampled, top = logprobs[1]
    assert top == [] and sampled == _logits(2).log_softmax(dim=1)[1, tokens[1]].item()


def test_logprobs_see_penalties(backend: str) -> None:
    logits = _logits(1)
    best = int(logits.argmax())
    request = make_request(temperature=0.0, output=[best], presence_penalty=2.0, logprobs=1)
    _, logprobs = Sampler(VOCAB, eos_token_ids=[], backend=backend).sample(logits, [request])
    penalised = logits.clone()
    penalised[0, best] -= 2.0
    assert logprobs is not None
    assert logprobs[0][1][0][1] == penalised.log_softmax(dim=1).max().item()
