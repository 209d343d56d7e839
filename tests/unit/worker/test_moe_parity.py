"""The mixture-of-experts architectures (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE) on the paged cache give
transformers' greedy tokens (float32, CPU), however the work is cut up: chunked prefill on the runner,
and through the whole engine a pool so small that requests are preempted and recomputed under a token
budget that chunks every prompt. The tiny models' odd shapes are tests/harness/tiny_models.py's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from harness.tiny_models import MOE_ARCHITECTURES
from worker_driver import GREEDY, StepDriver

from pagedserve import LLM, SamplingParams
from pagedserve.services.worker.layers.moe import SparseMoeBlock
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.protocol.step import Execute, NewRequest

MAX_TOKENS = 12
PROMPT_LENGTHS = (1, 3, 7, 17, 33, 64, 5, 90)


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 259) for _ in range(n)] for n in PROMPT_LENGTHS]


def _reference_model(path: Path) -> torch.nn.Module:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32
    )


@torch.inference_mode()
def _reference_generate(path: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """One prompt at a time (no padding involved); stops after EOS, as the engine does."""
    model = _reference_model(path)
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


@pytest.fixture(scope="module")
def reference(tiny_model):
    """Per architecture: (checkpoint, transformers' greedy outputs), built once for the module."""
    cache: dict[str, tuple[Path, list[list[int]]]] = {}

    def get(arch: str) -> tuple[Path, list[list[int]]]:
        if arch not in cache:
            path = tiny_model(arch)
            cache[arch] = (path, _reference_generate(path, _prompts(), MAX_TOKENS))
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_first_step_logits_match_transformers(tiny_model, arch):
    path = tiny_model(arch)
    prompts = _prompts()
    runner = ModelRunner(path, block_size=16, num_blocks=128)
    step = Execute(0)
    next_block = 0
    for i, prompt in enumerate(prompts):
        blocks = list(range(next_block, next_block + -(-len(prompt) // 16)))
        next_block += len(blocks)
        step.new_requests.append(NewRequest(f"r{i}", prompt, len(prompt), 0, len(prompt), blocks, GREEDY))
    _result, logits = runner.execute_with_logits(step)
    with torch.inference_mode():
        model = _reference_model(path)
        expected = torch.stack([model(torch.tensor([p])).logits[0, -1] for p in prompts])
    assert logits is not None
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


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
    path = str(tiny_model("qwen2_moe"))
    system = list(range(10, 74))  # 64 tokens: 4 full blocks of 16
    questions = [[100 + i, 101 + i, 102 + i] for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    cold = LLM(path, num_blocks=128, block_size=16, enable_prefix_caching=False)
    expected = [o.token_ids for o in cold.generate([system + q for q in questions], params)]
    llm = LLM(path, num_blocks=128, block_size=16)
    first = llm.generate([system + questions[0]], params)
    rest = llm.generate([system + q for q in questions[1:]], params)
    assert [o.num_cached_tokens for o in first + rest] == [0, 64, 64]
    assert [o.token_ids for o in first + rest] == expected
