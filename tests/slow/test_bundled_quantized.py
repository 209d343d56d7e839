"""The bundled SmolLM2 served in its GGUF's own types (Q4_1 linears, a Q8_0 embedding and tied head)
against the dequantize-then-float32 reference (the same file, --quantization none): the
same weights, so only the order of float32 sums differs. Allowance: 8 chat-like prompts, 16 greedy
tokens each; every first token equal and at least 7 of 8 equal token for token."""

from __future__ import annotations

import pytest

from pagedserve import LLM, SamplingParams

# Two loads of the bundled model and 8 generations: minutes on 2 busy cores.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "The largest planet in the solar system is",
    "In machine learning, a neural network is",
]


def _greedy(quantization: str) -> tuple[list[list[int]], str]:
    llm = LLM("smollm2-135m", num_blocks=256, quantization=quantization)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    return [o.token_ids for o in llm.generate(PROMPTS, params)], llm.runner.runtime["weights"]


def test_bundled_q4_1_greedy_matches_its_dequantized_float32_reference() -> None:
    quantized, weights = _greedy("gguf")
    reference, dense = _greedy("none")
    assert weights.startswith("gguf Q4_1x") and "Q8_0" in weights, weights
    assert dense == "float32"
    assert [q[0] for q in quantized] == [r[0] for r in reference]
    same = sum(q == r for q, r in zip(quantized, reference, strict=True))
    assert same >= 7, f"{same}/8 prompts matched token for token"
