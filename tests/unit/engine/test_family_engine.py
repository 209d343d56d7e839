"""Gemma 2, Gemma 3 and Phi-3 through the in-process engine (scheduler + block manager + runner) against
transformers `generate`, greedy, float32: however the work is cut up (a pool so small that requests
are preempted and recomputed, a token budget that chunks every prompt), the tokens are transformers'.
Per family also: a shared prefix served from the prefix cache, and a JSON-schema constrained output.

`phi3-longrope` adds the LongRoPE switch: prompts that cross its original length (48) while
generating are recomputed with the long factors, as transformers recomputes them, and requests past
the length keep their prefix-cache entries apart from those within it.
"""

from __future__ import annotations

import json

import pytest
from harness.parity import (
    after_a_shared_system_prompt,
    assert_engine_gives,
    assert_pool_whole,
    seeded_prompts,
    transformers_greedy,
)
from harness.tiny_models import FAMILIES, LONGROPE_ORIGINAL

from pagedserve import LLM, SamplingParams

MAX_TOKENS = 12
# Longer than every window (13, 11, 29); for phi3-longrope 40 and 45 cross position 48 while generating.
LENGTHS = [1, 3, 7, 16, 17, 30, 40, 45, 64, 5, 90, 2, 33, 8, 70, 12]


def _prompts() -> list[list[int]]:
    return seeded_prompts(LENGTHS, top=300)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tiny_model):
    """(arch, checkpoint, transformers' greedy outputs for _prompts())."""
    path = tiny_model(request.param)
    return request.param, path, _transformers_outputs(path)


def _transformers_outputs(path) -> list[list[int]]:
    return transformers_greedy(path, _prompts(), MAX_TOKENS)


def _matches_transformers(path, expected, **engine_kwargs) -> LLM:
    return assert_engine_gives(expected, path, _prompts(), MAX_TOKENS, **engine_kwargs)


def test_a_tiny_pool_preempts_and_still_matches_transformers(family):
    arch, path, expected = family
    llm = _matches_transformers(path, expected, num_blocks=24, block_size=8, max_num_seqs=16)
    assert llm.scheduler.stats.preemptions > 0, "the pool was meant to be too small for everyone at once"
    if arch == "phi3-longrope":
        assert llm.scheduler.stats.rope_recomputes >= 2  # the prompts of 40 and 45 crossed 48


def test_a_token_budget_of_32_chunks_prefill_and_matches_transformers(family):
    _arch, path, expected = family
    _matches_transformers(path, expected, num_blocks=512, block_size=8, max_num_batched_tokens=32)


def test_a_shared_prefix_is_served_from_the_prefix_cache(family):
    _arch, path, _ = family
    # The system prompt of 64 tokens is longer than every window.
    llm, cached, got, cold = after_a_shared_system_prompt(path, questions=3, num_blocks=256)
    assert cached == [0, 64, 64]
    assert got == cold
    assert_pool_whole(llm)


def test_a_json_schema_constrains_the_output(family):
    _arch, path, _ = family
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
        "required": ["n", "ok"],
        "additionalProperties": False,
    }
    llm = LLM(str(path), num_blocks=128, block_size=16)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=40, structured_outputs={"json": schema})
    out = llm.generate(["A number and a flag: " * 3], params)[0]
    value = json.loads(out.text)
    assert set(value) == {"n", "ok"} and 0 <= value["n"] <= 99 and isinstance(value["ok"], bool)
    assert_pool_whole(llm)


def test_longrope_requests_past_the_switch_keep_their_prefix_cache_apart(tiny_model):
    """The same 32-token prefix, rotated with the short factors (a prompt within 48) and with the long
    ones (a prompt past it), is other KV: neither hits the other's blocks, and each gives the tokens a
    cold engine gives."""
    path = tiny_model("phi3-longrope")
    prefix = list(range(20, 52))  # 2 blocks of 16
    short, long = prefix + [7, 8, 9], prefix + list(range(100, 100 + LONGROPE_ORIGINAL))
    params = SamplingParams(temperature=0.0, max_tokens=4)
    cold = LLM(str(path), num_blocks=128, block_size=16, enable_prefix_caching=False)
    expected = [o.token_ids for o in cold.generate([short, long], params)]
    llm = LLM(str(path), num_blocks=128, block_size=16)
    first = llm.generate([short], params)[0]
    crossing = llm.generate([long], params)[0]  # past 48: the long namespace, empty
    again = llm.generate([long], params)[0]  # hits its own namespace
    assert (first.num_cached_tokens, crossing.num_cached_tokens) == (0, 0)
    assert again.num_cached_tokens == (len(long) - 1) // 16 * 16  # the last prompt token is computed
    assert [first.token_ids, crossing.token_ids] == expected and again.token_ids == crossing.token_ids
    assert_pool_whole(llm)


class _Oracle:
    """Proposes each prompt's known continuation: every proposal is accepted, so lookahead runs as far
    as the scheduler lets it."""

    name = "oracle"

    def __init__(self, answers: dict[tuple[int, ...], list[int]]) -> None:
        self.answers = answers

    def propose(self, state, k: int) -> list[int]:
        done = len(state.output_token_ids)
        return list(self.answers.get(tuple(state.prompt_token_ids), [])[done : done + k])

    def finished(self, state) -> None:
        pass


def test_longrope_with_speculation_proposes_no_token_past_the_switch(tiny_model):
    """Speculative decoding's proposals stop before the original length (48) while a request is rotated
    short: the crossing is still a recompute, and the tokens are transformers'."""
    path = tiny_model("phi3-longrope")
    prompts = _prompts()
    expected = _transformers_outputs(path)
    spec = {"method": "ngram", "num_speculative_tokens": 4, "max_step_rows": 64, "row_cost": 0.0}
    llm = LLM(str(path), num_blocks=256, block_size=16, speculative_config=spec)
    llm.runner.proposer = _Oracle({tuple(p): e for p, e in zip(prompts, expected, strict=True)})
    got = [o.token_ids for o in llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))]
    assert got == expected
    assert llm.scheduler.stats.rope_recomputes >= 2
    assert_pool_whole(llm)
