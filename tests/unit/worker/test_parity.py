"""Our model code on the paged cache matches Hugging Face transformers, token for token (float32, CPU)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from harness.tiny_models import ARCHITECTURES
from worker_driver import GREEDY, StepDriver

from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.protocol.step import Execute, NewRequest

MAX_TOKENS = 32
PROMPT_LENGTHS = (1, 2, 7, 13, 16, 33, 64, 100, 17)


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
    """One prompt at a time (no padding involved); stops after EOS, like our driver."""
    model = _reference_model(path)
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
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
    prompts = _prompts()
    runner = ModelRunner(path, block_size=16, num_blocks=128)
    step = Execute(0)
    next_block = 0
    for i, prompt in enumerate(prompts):
        blocks = list(range(next_block, next_block + -(-len(prompt) // 16)))
        next_block += len(blocks)
        step.new_requests.append(NewRequest(f"r{i}", prompt, len(prompt), 0, len(prompt), blocks, GREEDY))
    _result, logits = runner.execute_with_logits(step)
    model = _reference_model(path)
    with torch.inference_mode():
        expected = torch.stack([model(torch.tensor([p])).logits[0, -1] for p in prompts])
    assert logits is not None
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


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
    step = Execute(
        0, new_requests=[NewRequest("r", prompt, len(prompt), 0, len(prompt), list(range(10)), GREEDY)]
    )
    _result, logits = runner.execute_with_logits(step)
    with torch.inference_mode():
        expected = _reference_model(path)(torch.tensor([prompt])).logits[0, -1]
    assert logits is not None
    torch.testing.assert_close(logits[0], expected, atol=1e-4, rtol=0)
    assert runner.model_config.rope.rope_type == kind
