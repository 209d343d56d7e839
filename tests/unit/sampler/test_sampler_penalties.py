"""Penalties move exactly the logits of seen tokens, by the right amount; min_tokens masks stops."""

from __future__ import annotations

import torch
from sampling_requests import make_request

from pagedserve.services.worker.penalties import apply_penalties
from pagedserve.services.worker.sampler import Sampler

VOCAB = 12


def _logits() -> torch.Tensor:
    # Positive and negative logits, so repetition's divide / multiply both show.
    return torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0, 0.0, 4.0, -4.0, 1.5]])


def _penalise(
    prompt: list[int],
    output: list[int],
    repetition: float = 1.0,
    presence: float = 0.0,
    frequency: float = 0.0,
) -> torch.Tensor:
    return apply_penalties(_logits(), [prompt], [output], [repetition], [presence], [frequency])


def test_repetition_divides_positive_and_multiplies_negative_seen_logits() -> None:
    before = _logits()[0]
    after = _penalise(prompt=[0, 1], output=[2, 3, 3], repetition=2.0)[0]
    expected = before.clone()
    expected[[0, 2]] /= 2.0
    expected[[1, 3]] *= 2.0
    assert torch.equal(after, expected)


def test_presence_subtracts_once_from_each_output_token() -> None:
    before = _logits()[0]
    after = _penalise(prompt=[0, 1], output=[4, 5, 5, 5], presence=0.5)[0]
    expected = before.clone()
    expected[[4, 5]] -= 0.5
    assert torch.equal(after, expected)  # prompt tokens 0 and 1 untouched


def test_frequency_subtracts_once_per_occurrence_in_the_output() -> None:
    before = _logits()[0]
    after = _penalise(prompt=[0], output=[4, 5, 5, 5, 9, 9], frequency=0.25)[0]
    expected = before.clone()
    expected[4] -= 0.25
    expected[5] -= 0.75
    expected[9] -= 0.5
    assert torch.allclose(after, expected)
    assert torch.equal(after[[0, 1, 2, 3, 6, 7, 8, 10, 11]], before[[0, 1, 2, 3, 6, 7, 8, 10, 11]])


def test_penalties_combine_repetition_first() -> None:
    after = _penalise(prompt=[6], output=[6, 7, 7], repetition=1.5, presence=0.1, frequency=0.2)[0]
    assert torch.allclose(after[6], torch.tensor(3.0 / 1.5 - 0.1 - 0.2))
    assert torch.allclose(after[7], torch.tensor(-3.0 * 1.5 - 0.1 - 0.4))


def test_penalties_are_per_row_in_a_batch() -> None:
    logits = _logits().repeat(3, 1)
    apply_penalties(
        logits, [[0], [1], [2]], [[], [9, 9], []], [2.0, 1.0, 1.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]
    )
    base = _logits()[0]
    assert torch.equal(logits[0], base.clone().index_put_((torch.tensor([0]),), base[[0]] / 2))
    assert torch.equal(logits[1], base.clone().index_put_((torch.tensor([9]),), base[[9]] - 2))
    assert torch.equal(logits[2], base)  # presence without output tokens changes nothing


def test_sampler_applies_penalties_before_greedy_choice(backend: str) -> None:
    # Token 9 is the best, but the output repeats it: a repetition penalty moves greedy to token 6.
    request = make_request(temperature=0.0, output=[9], repetition_penalty=2.0)
    tokens, _ = Sampler(VOCAB, eos_token_ids=[], backend=backend).sample(_logits(), [request])
    assert tokens == [6]


def test_min_tokens_masks_eos_and_stop_ids_until_reached(backend: str) -> None:
    logits = torch.zeros(3, VOCAB)
    logits[:, 9] = 10.0  # EOS would win
    logits[:, 6] = 9.0  # then the stop id
    logits[:, 0] = 8.0
    requests = [
        make_request(temperature=0.0, min_tokens=2, max_tokens=4, stop_token_ids=[6], output=[1]),
        make_request(temperature=0.0, min_tokens=2, max_tokens=4, stop_token_ids=[6], output=[1, 1]),
        make_request(temperature=0.0, min_tokens=2, max_tokens=4, stop_token_ids=[6], ignore_eos=True),
    ]
    tokens, _ = Sampler(VOCAB, eos_token_ids=[9], backend=backend).sample(logits, requests)
    assert tokens == [0, 9, 0]


def test_min_tokens_masks_stops_for_sampled_rows_too(backend: str) -> None:
    logits = torch.zeros(500, VOCAB)
    logits[:, 9] = 3.0
    requests = [make_request(temperature=1.0, min_tokens=1, stop_token_ids=[4, 5])] * 500
    tokens, _ = Sampler(VOCAB, eos_token_ids=[9], backend=backend).sample(logits, requests)
    assert not {4, 5, 9} & set(tokens)


def test_sampling_leaves_the_callers_logits_unchanged(backend: str) -> None:
    logits = _logits()
    request = make_request(temperature=0.7, top_k=3, output=[9], repetition_penalty=2.0, min_tokens=3)
    Sampler(VOCAB, eos_token_ids=[6], backend=backend).sample(logits, [request])
    assert torch.equal(logits, _logits())
