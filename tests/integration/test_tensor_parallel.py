"""Tensor parallelism through the real worker path: a deployment whose one worker is a group of two
gloo ranks (each holding half the heads and half of every MLP) gives the greedy tokens of the
in-process engine's one process, for the Llama family (Llama; Qwen2 with its q/k/v biases; Gemma 3 with
its four norms a layer; Phi-3, whose checkpoint stores q/k/v and gate/up fused) and mixtures of experts
(Mixtral; Qwen2-MoE with its shared expert and dense layers between sparse ones)."""

from __future__ import annotations

import pytest
from harness.tensor_parallel import group_greedy, one_process_greedy

MAX_TOKENS = 24
# Some tiny models have 3 heads or 3 kv heads: changed here, so that both counts split over two ranks.
MODELS = {
    "llama": {},
    "qwen2": {},
    "gemma3": {},
    "phi3": {},
    "mixtral": {"num_key_value_heads": 2},
    "qwen2_moe": {"num_attention_heads": 4, "num_key_value_heads": 2},
}


def prompts() -> list[list[int]]:
    return [[(13 * i + 7 * j) % 250 + 3 for j in range(9 + 5 * i)] for i in range(3)]


@pytest.mark.parametrize("arch", list(MODELS))
def test_two_ranks_give_the_greedy_tokens_of_one_process(tiny_model, tmp_path, arch):
    model = tiny_model(arch, **MODELS[arch])
    expected = one_process_greedy(model, prompts(), MAX_TOKENS)
    assert group_greedy(model, tmp_path, 2, prompts(), MAX_TOKENS) == expected
