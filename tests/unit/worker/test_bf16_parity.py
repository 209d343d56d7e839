"""bfloat16: our logits stay as close to transformers' bfloat16 run as that run is to its own float32.

Exact parity is a float32 promise (test_parity.py). In bfloat16 both sides round differently, so the
check is that we add no error of our own: measured against transformers in float32 (the truth), ours
may be no farther than transformers' bfloat16 is, and ours and transformers' bfloat16 may differ by
no more than that same distance. Prefill logits and one decode step (the paged decode kernel's path).
"""

from __future__ import annotations

import random

import pytest
import torch
from worker_driver import GREEDY

from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.protocol.step import CachedRequest, Execute, NewRequest

PROMPT_LENGTHS = (1, 7, 16, 33, 64, 100)
# Slack over transformers' own bf16 distance: rounding differs per op order, not in size.
SLACK = 1.25


def _prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 259) for _ in range(n)] for n in PROMPT_LENGTHS]


def _ours(path, prompts, backend: str) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """-> (prefill logits, the greedy tokens they give, the next decode step's logits), float32."""
    # allow_slow_dtype: on a CPU without native bf16 the model code is still checked (tiny models).
    runner = ModelRunner(
        path,
        dtype="bfloat16",
        block_size=16,
        num_blocks=128,
        attention_backend=backend,
        allow_slow_dtype=True,
    )
    step, next_block = Execute(0), 0
    for i, prompt in enumerate(prompts):
        blocks = list(range(next_block, next_block + -(-(len(prompt) + 1) // 16)))
        next_block += len(blocks)
        step.new_requests.append(NewRequest(f"r{i}", prompt, len(prompt), 0, len(prompt), blocks, GREEDY))
    result, prefill = runner.execute_with_logits(step)
    decode = Execute(1, cached_requests=[CachedRequest(f"r{i}", 1) for i in range(len(prompts))])
    _result, decoded = runner.execute_with_logits(decode)
    assert prefill is not None and decoded is not None
    return prefill.float(), list(result.token_ids), decoded.float()


@torch.inference_mode()
def _transformers(path, sequences: list[list[int]], dtype: torch.dtype) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=dtype)
    return torch.stack([model(torch.tensor([s])).logits[0, -1].float() for s in sequences])


def _distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().mean())


CASES = [
    *((arch, backend) for arch in ("llama", "qwen3") for backend in ("cpp", "torch")),
    ("gemma2", "cpp"),  # (1 + w) norms folded in bfloat16, the embedding scale, softcaps
    ("gemma3", "torch"),
    ("phi3", "cpp"),
]


@pytest.mark.parametrize(("arch", "backend"), CASES)
def test_bf16_logits_add_no_error_of_our_own(tiny_model, arch, backend):
    path = tiny_model(arch)
    prompts = _prompts()
    prefill, tokens, decoded = _ours(path, prompts, backend)
    for ours, sequences in (
        (prefill, prompts),
        (decoded, [p + [t] for p, t in zip(prompts, tokens, strict=True)]),
    ):
        truth = _transformers(path, sequences, torch.float32)
        theirs = _transformers(path, sequences, torch.bfloat16)
        budget = _distance(theirs, truth)
        assert budget > 0  # bf16 really ran on their side
        assert _distance(ours, truth) <= SLACK * budget
        assert _distance(ours, theirs) <= SLACK * budget
