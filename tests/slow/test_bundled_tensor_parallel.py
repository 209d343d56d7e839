"""The bundled SmolLM2-135M over three tensor-parallel ranks (its 9 heads and 3 kv heads divide by 3,
not by 2) gives the greedy tokens of one process, both loaded dense from its GGUF: real weights, the
GGUF's own tensor names and row order, cut to each rank."""

from __future__ import annotations

from harness.tensor_parallel import group_greedy, one_process_greedy

MAX_TOKENS = 16


def test_three_ranks_of_the_bundled_model_give_the_greedy_tokens_of_one_process(tmp_path):
    prompts = [[(13 * i + 7 * j) % 2000 + 100 for j in range(9 + 5 * i)] for i in range(3)]
    expected = one_process_greedy("smollm2-135m", prompts, MAX_TOKENS, quantization="none")
    assert group_greedy("smollm2-135m", tmp_path, 3, prompts, MAX_TOKENS) == expected
