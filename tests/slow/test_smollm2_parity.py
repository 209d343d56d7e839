"""On the real SmolLM2-135M-Instruct (float32), batched greedy decoding through our runner equals
transformers' generate(do_sample=False), token for token, for chat prompts. Both read the bundled GGUF:
we map it and dequantize in memory, transformers dequantizes it with its own reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from harness.bundled_reference import transformers_bundled

from pagedserve.services.checkpoint import resolve_model
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import CachedRequest, Execute, NewRequest, WorkerSampling

pytestmark = pytest.mark.slow

MAX_TOKENS = 16
BLOCK_SIZE = 16
QUESTIONS = (
    "What is the capital of France?",
    "Give me three tips for staying healthy.",
    "Write a haiku about the sea.",
    "Explain what a hash table is in one sentence.",
)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def reference() -> tuple[Any, Any]:
    return transformers_bundled()


@pytest.fixture(scope="module")
def chat_prompts(reference: tuple[Any, Any]) -> list[list[int]]:
    tokenizer, _ = reference
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for q in QUESTIONS
    ]


def _runner_greedy(runner: ModelRunner, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """A tiny stand-in scheduler: every request runs every step; blocks handed out in order as needed."""
    greedy = WorkerSampling.of(SamplingParams(temperature=0.0, max_tokens=max_tokens), None)
    next_block = 0
    tables: list[list[int]] = [[] for _ in prompts]

    def grow(i: int, num_tokens: int) -> list[int]:
        nonlocal next_block
        needed = -(-num_tokens // BLOCK_SIZE) - len(tables[i])
        new = list(range(next_block, next_block + needed))
        next_block += needed
        tables[i] += new
        return new

    first = Execute(0)
    for i, prompt in enumerate(prompts):
        grow(i, len(prompt))
        first.new_requests.append(
            NewRequest(f"chat-{i}", prompt, len(prompt), 0, len(prompt), list(tables[i]), greedy)
        )
    outputs = [[token] for token in runner.execute(first).token_ids]
    for step in range(1, max_tokens):
        decode = Execute(step)
        for i, prompt in enumerate(prompts):
            new_blocks = grow(i, len(prompt) + step + 1)
            decode.cached_requests.append(CachedRequest(f"chat-{i}", 1, new_blocks))
        result = runner.execute(decode)
        assert result.request_ids == [f"chat-{i}" for i in range(len(prompts))]
        for output, token in zip(outputs, result.token_ids, strict=True):
            output.append(token)
    return outputs


@torch.inference_mode()
def _transformers_greedy(model: Any, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """One prompt at a time, so no padding is involved; stops after EOS."""
    outputs = []
    for prompt in prompts:
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False)
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


def test_batched_greedy_chat_matches_transformers(
    smollm2: Path, chat_prompts: list[list[int]], reference: tuple[Any, Any]
) -> None:
    runner = ModelRunner(smollm2, dtype="float32", block_size=BLOCK_SIZE, num_blocks=64, quantization="none")
    ours = _runner_greedy(runner, chat_prompts, MAX_TOKENS)
    expected = _transformers_greedy(reference[1], chat_prompts, MAX_TOKENS)
    eos = set(runner.eos_token_ids)
    for mine, theirs in zip(ours, expected, strict=True):
        # transformers stops at EOS; our driver decodes on, and the tokens after EOS do not count.
        assert mine[: len(theirs)] == theirs
        assert len(theirs) == MAX_TOKENS or theirs[-1] in eos
