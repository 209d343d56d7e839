"""Our model code on the paged cache matches Hugging Face transformers, token for token (float32, CPU)."""

from __future__ import annotations

import pytest
from harness.parity import assert_prefill_matches_transformers, greedy_by_arch, seeded_prompts
from harness.tiny_models import ARCHITECTURES
from worker_driver import StepDriver

from pagedserve.services.worker.runner import ModelRunner

MAX_TOKENS = 32
PROMPT_LENGTHS = (1, 2, 7, 13, 16, 33, 64, 100, 17)


def _prompts(seed: int = 0) -> list[list[int]]:
    return seeded_prompts(PROMPT_LENGTHS, seed)


@pytest.fixture(scope="module")
def reference(tiny_model):
    """Per architecture: (checkpoint, transformers' greedy outputs), built once for the module."""
    return greedy_by_arch(tiny_model, lambda _arch: _prompts(), MAX_TOKENS)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize(("block_size", "chunk_size"), [(8, None), (16, None), (32, None), (8, 7), (16, 7)])
def test_batched_greedy_generation_matches_transformers(reference, arch, block_size, chunk_size):
    path, expected = reference(arch)
    runner = ModelRunner(path, block_size=block_size, num_blocks=2048 // block_size)
    outputs = StepDriver(runner, chunk_size=chunk_size, stop_token_ids=tuple(runner.eos_token_ids)).generate(
        _prompts(), MAX_TOKENS
    )
    assert outputs == expected


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_first_step_logits_match_transformers(tiny_model, arch):
    path = tiny_model(arch)
    runner = ModelRunner(path, block_size=16, num_blocks=128)
    assert_prefill_matches_transformers(runner, path, _prompts())


ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}


@pytest.mark.parametrize("kind", sorted(ROPE_SCALINGS))
def test_rope_scaling_matches_transformers(tiny_model, kind):
    path = tiny_model("llama", rope_scaling=ROPE_SCALINGS[kind])
    prompt = _prompts(seed=1)[7]  # 100 tokens: past llama3's original context of 64
    runner = ModelRunner(path, block_size=16, num_blocks=64)
    assert_prefill_matches_transformers(runner, path, [prompt])
    assert runner.model_config.rope.rope_type == kind
