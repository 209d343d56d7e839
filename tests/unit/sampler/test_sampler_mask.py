"""The constraint mask and logit_bias in the sampler, on both backends: a masked row only ever takes an
allowed token (greedy and drawn), an unmasked row is untouched, and a +100 bias wins."""

from __future__ import annotations

import torch
import xgrammar as xgr
from sampling_requests import make_request

from pagedserve.services.constraints.matcher import TokenMask
from pagedserve.services.worker.sampler import Sampler

VOCAB = 300


def mask_allowing(rows: list[int], allowed: list[list[int]]) -> TokenMask:
    bitmask = xgr.allocate_token_bitmask(len(rows), VOCAB)
    bitmask.zero_()
    for j, tokens in enumerate(allowed):
        for t in tokens:
            bitmask[j, t // 32] |= torch.tensor(1 << (t % 32), dtype=torch.int64).to(torch.int32)
    return TokenMask(rows, bitmask)


def test_masked_rows_take_only_allowed_tokens_greedy_and_drawn(backend):
    sampler = Sampler(VOCAB, [2], backend=backend)
    allowed = [[5, 77, 299], [31, 32, 33, 64]]
    requests = [
        make_request(temperature=0.0),
        make_request(temperature=1.0, seed=3),
        make_request(temperature=0.0),
    ]
    for trial in range(20):
        logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(trial)) * 5
        unmasked_best = int(logits[2].argmax())
        tokens, _ = sampler.sample(logits, requests, mask_allowing([0, 1], allowed))
        assert tokens[0] == max(allowed[0], key=lambda t: logits[0, t])  # greedy: the best allowed
        assert tokens[1] in allowed[1]
        assert tokens[2] == unmasked_best  # a row without a mask pays nothing and changes nothing


def test_a_mask_on_every_row_with_logprobs_reports_the_masked_distribution(backend):
    sampler = Sampler(VOCAB, [2], backend=backend)
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1))
    tokens, logprobs = sampler.sample(
        logits, [make_request(temperature=0.0, logprobs=2)], mask_allowing([0], [[9, 10]])
    )
    assert tokens[0] in (9, 10)
    assert {t for t, _ in logprobs[0][1]} == {9, 10}  # nothing else has any probability left


def test_logit_bias_of_100_makes_its_token_the_greedy_choice(backend):
    sampler = Sampler(VOCAB, [2], backend=backend)
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2))
    requests = [make_request(temperature=0.0, logit_bias={123: 100.0}), make_request(temperature=0.0)]
    tokens, _ = sampler.sample(logits, requests)
    assert tokens == [123, int(logits[1].argmax())]
