"""The mixture-of-experts architectures (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE) on the paged cache give
transformers' greedy tokens (float32, CPU), however the work is cut up: chunked prefill on the runner,
and through the whole engine a pool so small that requests are preempted and recomputed under a token
budget that chunks every prompt. The tiny models' odd shapes are tests/harness/tiny_models.py's."""

from __future__ import annotations

import pytest
from harness.parity import (
    after_a_shared_system_prompt,
    assert_prefill_matches_transformers,
    greedy_by_arch,
    seeded_prompts,
)
from harness.tiny_models import MOE_ARCHITECTURES
from worker_driver import StepDriver

from pagedserve import LLM, SamplingParams
from pagedserve.services.worker.layers.moe import SparseMoeBlock
from pagedserve.services.worker.runner import ModelRunner

MAX_TOKENS = 12
PROMPT_LENGTHS = (1, 3, 7, 17, 33, 64, 5, 90)


def _prompts() -> list[list[int]]:
    return seeded_prompts(PROMPT_LENGTHS)


@pytest.fixture(scope="module")
def reference(tiny_model):
    """Per architecture: (checkpoint, transformers' greedy outputs), built once for the module."""
    return greedy_by_arch(tiny_model, lambda _arch: _prompts(), MAX_TOKENS)


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_first_step_logits_match_transformers(tiny_model, arch):
    path = tiny_model(arch)
    runner = ModelRunner(path, block_size=16, num_blocks=128)
    assert_prefill_matches_transformers(runner, path, _prompts())


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_chunked_prefill_on_the_runner_matches_transformers(reference, arch):
    path, expected = reference(arch)
    runner = ModelRunner(path, block_size=8, num_blocks=512)
    driver = StepDriver(runner, chunk_size=7, stop_token_ids=tuple(runner.eos_token_ids))
    assert driver.generate(_prompts(), MAX_TOKENS) == expected


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_preempted_and_chunked_engine_matches_transformers(reference, arch):
    path, expected = reference(arch)
    llm = LLM(str(path), num_blocks=20, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)
    outs = llm.generate(_prompts(), SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert llm.scheduler.stats.preemptions > 0, "the pool was meant to be too small for everyone at once"
    assert [o.token_ids for o in outs] == expected
    snap = llm.block_manager.snapshot(0.0)
    assert snap["totals"]["free"] == snap["totals"]["total"], snap["totals"]


def test_the_sparse_layers_are_the_configs(tiny_model):
    """Qwen2-MoE's decoder_sparse_step 2 and Qwen3-MoE's mlp_only_layers [1] leave dense layers between."""
    sparse = {}
    for arch in ("qwen2_moe", "qwen3_moe", "mixtral"):
        model = ModelRunner(tiny_model(arch), block_size=16, num_blocks=8).model
        sparse[arch] = [isinstance(layer.mlp, SparseMoeBlock) for layer in model.layers]
    assert sparse == {
        "qwen2_moe": [False, True, False, True],
        "qwen3_moe": [True, False, True],
        "mixtral": [True, True],
    }


def test_a_shared_system_prompt_is_served_from_the_prefix_cache(tiny_model):
    _llm, cached, got, cold = after_a_shared_system_prompt(
        tiny_model("qwen2_moe"), questions=3, num_blocks=128
    )
    assert cached == [0, 64, 64]
    assert got == cold
