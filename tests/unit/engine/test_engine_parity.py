"""The in-process engine (scheduler + block manager + model runner) against transformers `generate`.

Greedy, float32, a tiny random Llama: the tokens must be identical however the work is cut up —
ample memory or a pool so small that requests are preempted and recomputed, a token budget that
chunks every prompt, pipeline depth 1, 2 or 3.
"""

from __future__ import annotations

import pytest
from harness import parity

from pagedserve import LLM, SamplingParams

MAX_TOKENS = 12
LENGTHS = [1, 3, 7, 16, 17, 30, 45, 64, 5, 90, 2, 33, 8, 70, 12, 100]


def prompts_of_mixed_lengths() -> list[list[int]]:
    return parity.seeded_prompts(LENGTHS, top=300)


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("llama")


@pytest.fixture(scope="module")
def reference(model_path) -> list[list[int]]:
    """transformers greedy, one prompt at a time (no padding anywhere), EOS included as HF returns it."""
    return parity.transformers_greedy(model_path, prompts_of_mixed_lengths(), MAX_TOKENS)


def matches_transformers(model_path, reference, **engine_kwargs) -> LLM:
    return parity.assert_engine_gives(
        reference, model_path, prompts_of_mixed_lengths(), MAX_TOKENS, **engine_kwargs
    )


def test_ample_memory_matches_transformers(model_path, reference):
    matches_transformers(model_path, reference, num_blocks=512, block_size=16)


def test_tiny_pool_preempts_and_still_matches_transformers(model_path, reference):
    llm = matches_transformers(model_path, reference, num_blocks=20, block_size=8, max_num_seqs=16)
    assert llm.scheduler.stats.preemptions > 0, "the pool was meant to be too small for everyone at once"


def test_token_budget_of_32_chunks_prefill_and_matches_transformers(model_path, reference):
    matches_transformers(model_path, reference, num_blocks=512, block_size=8, max_num_batched_tokens=32)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_pipeline_depth_does_not_change_tokens(model_path, reference, depth):
    matches_transformers(model_path, reference, num_blocks=256, block_size=16, pipeline_depth=depth)


def test_shared_system_prompt_is_served_from_the_prefix_cache(model_path):
    llm, cached, got, cold = parity.after_a_shared_system_prompt(model_path, questions=4, num_blocks=256)
    assert cached == [0, 64, 64, 64]
    assert got == cold
    parity.assert_pool_whole(llm)


def test_n3_with_seed_gives_three_completions_sharing_prompt_blocks(model_path):
    llm = LLM(str(model_path), num_blocks=256, block_size=8, pipeline_depth=1)
    prompt = list(range(20, 60))  # 40 tokens: 5 full blocks of 8
    params = SamplingParams(temperature=1.0, seed=1234, n=3, max_tokens=8)
    seen_refs: list[int] = []
    engine_step = llm.engine.step

    def watching_step():
        events = engine_step()
        snap = llm.block_manager.snapshot(0.0)
        for pool in snap["pools"]:
            seen_refs.extend(b["ref_count"] for b in pool["blocks"])
        return events

    llm.engine.step = watching_step
    out = llm.generate([prompt], params)[0]
    assert len(out.outputs) == 3
    completions = [tuple(c.token_ids) for c in out.outputs]
    assert len(set(completions)) == 3, completions
    assert max(seen_refs) == 3
    again = LLM(str(model_path), num_blocks=256, block_size=8).generate([prompt], params)[0]
    assert [tuple(c.token_ids) for c in again.outputs] == completions  # seeded: reproducible
    parity.assert_pool_whole(llm)


def test_text_prompts_and_stop_strings(model_path):
    llm = LLM(str(model_path), num_blocks=128, block_size=16)
    free = llm.generate(["hello world"], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0]
    assert free.text and len(free.token_ids) == 20
    stop = free.text[5:7]
    cut = llm.generate(
        ["hello world"], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop])
    )[0]
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.index(stop)]
    parity.assert_pool_whole(llm)
