"""Prompt logprobs (SamplingParams.prompt_logprobs) from the in-process engine against transformers.

A tiny random Llama in float32: each prompt position's logprob and top-n must be transformers'
log_softmax of the same model's logits, however the prefill is cut up (chunks, a prefix-cache hit
the request must not take, preemption and recompute), and they are sent once.
"""

from __future__ import annotations

import random

import pytest
import torch
from pydantic import ValidationError

from pagedserve import LLM, SamplingParams
from pagedserve.shared.protocol.frontend import MAX_LOGPROBS

TOP = 3
_rng = random.Random(7)
PROMPTS = [[_rng.randrange(3, 300) for _ in range(n)] for n in (1, 2, 9, 17, 40, 90)]


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("llama")


@pytest.fixture(scope="module")
def reference(model_path) -> list[torch.Tensor]:
    """transformers' log_softmax over the vocabulary at every position of each prompt, [P, vocab]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0].log_softmax(dim=-1) for p in PROMPTS]


def assert_matches(prompt: list[int], got, expected: torch.Tensor, top: int = TOP) -> None:
    assert got is not None and got.token_ids == prompt and got.num_top == top
    values = got.logprobs()
    assert len(values) == len(prompt) and values[0] is None  # nothing precedes the first token
    want = expected[:-1].gather(1, torch.tensor(prompt[1:]).unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(torch.tensor(values[1:]), want, atol=1e-4, rtol=0)
    tops = got.top()
    assert tops[0] == [] and len(tops) == len(prompt)
    if top and len(prompt) > 1:
        want_values, want_ids = expected[:-1].topk(top, dim=-1)
        assert [[tid for tid, _ in row] for row in tops[1:]] == want_ids.tolist()
        got_values = torch.tensor([[lp for _, lp in row] for row in tops[1:]])
        torch.testing.assert_close(got_values, want_values, atol=1e-4, rtol=0)


def run(llm: LLM, top: int = TOP, **params) -> list:
    fields = {"temperature": 0.0, "max_tokens": 4, **params}
    return llm.generate(PROMPTS, SamplingParams(prompt_logprobs=top, **fields))


def test_prompt_logprobs_equal_transformers_log_softmax(model_path, reference):
    llm = LLM(str(model_path), num_blocks=256, block_size=16)
    for prompt, out, expected in zip(PROMPTS, run(llm), reference, strict=True):
        assert_matches(prompt, out.prompt_logprobs, expected)


def test_top_zero_gives_only_each_prompt_tokens_own_logprob(model_path, reference):
    llm = LLM(str(model_path), num_blocks=256, block_size=16)
    for prompt, out, expected in zip(PROMPTS, run(llm, top=0), reference, strict=True):
        assert_matches(prompt, out.prompt_logprobs, expected, top=0)


def test_chunked_prefill_gives_the_same_numbers(model_path, reference):
    llm = LLM(str(model_path), num_blocks=256, block_size=8, max_num_batched_tokens=16)
    assert max(len(p) for p in PROMPTS) > 16 * 4  # the longest prompt takes several chunks
    for prompt, out, expected in zip(PROMPTS, run(llm), reference, strict=True):
        assert_matches(prompt, out.prompt_logprobs, expected)


def test_a_prefix_cached_prompt_is_computed_whole_for_its_logprobs(model_path, reference):
    llm = LLM(str(model_path), num_blocks=256, block_size=8)
    plain = SamplingParams(temperature=0.0, max_tokens=2)
    llm.generate(PROMPTS, plain)  # fills the prefix cache
    (again,) = llm.generate([PROMPTS[-1]], plain)
    assert again.num_cached_tokens > 0  # a plain request hits it
    outs = run(llm)
    for prompt, out, expected in zip(PROMPTS, outs, reference, strict=True):
        assert out.num_cached_tokens == 0
        assert_matches(prompt, out.prompt_logprobs, expected)
    (after,) = llm.generate([PROMPTS[-1]], plain)
    assert after.num_cached_tokens > 0  # and the cache still serves others


def test_preemption_recomputes_without_sending_prompt_logprobs_twice(model_path, reference):
    llm = LLM(str(model_path), num_blocks=24, block_size=8, max_num_seqs=16)
    sent: list[str] = []
    execute = llm.runner.execute

    def recording(step):
        result = execute(step)
        sent.extend(p.request_id for p in result.prompt_logprobs)
        return result

    llm.runner.execute = recording
    outs = run(llm, max_tokens=24, ignore_eos=True)
    assert llm.scheduler.stats.preemptions > 0, "the pool was meant to be too small for everyone at once"
    assert sorted(sent) == sorted(o.request_id for o in outs)  # each request's, once
    for prompt, out, expected in zip(PROMPTS, outs, reference, strict=True):
        assert_matches(prompt, out.prompt_logprobs, expected)


def test_forked_completions_share_their_prompts_logprobs(model_path, reference):
    llm = LLM(str(model_path), num_blocks=256, block_size=16)
    (out,) = llm.generate(
        [PROMPTS[2]], SamplingParams(temperature=1.0, seed=3, n=3, max_tokens=4, prompt_logprobs=TOP)
    )
    assert len(out.outputs) == 3
    assert_matches(PROMPTS[2], out.prompt_logprobs, reference[2])


def test_requests_without_prompt_logprobs_get_none(model_path):
    llm = LLM(str(model_path), num_blocks=256, block_size=16)
    (out,) = llm.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=2))
    assert out.prompt_logprobs is None and llm.runner.prompt_tallies == {}


def test_prompt_logprobs_past_the_limit_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=MAX_LOGPROBS + 1)
    with pytest.raises(ValidationError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
