"""Constrained streams through faults, on real processes: a worker SIGKILLed mid-decode and a pool so
small that requests are preempted and recomputed. The matcher is rebuilt on the new worker (or after
the recompute) by replaying the accepted tokens, so every output is valid and each greedy output is
the one a fault-free run gives."""

from __future__ import annotations

import asyncio
import json
import re
import signal

import pytest
from harness.deployment import get_text, start, wait_for, workers_ready
from harness.greedy_reference import random_prompts

from pagedserve import LLM, AsyncClient, SamplingParams
from pagedserve.shared.protocol.constraints import StructuredOutputs

pytestmark = pytest.mark.slow  # two deployments, a few minutes on busy cores

MAX_TOKENS = 80
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999},
        "tag": {"type": "string", "maxLength": 12},
        "ok": {"type": "boolean"},
    },
    "required": ["id", "tag", "ok"],
    "additionalProperties": False,
}
REGEX = "[a-z]{3,20}(-[0-9]{1,4}){1,6}"
CONSTRAINTS = [StructuredOutputs(json=SCHEMA), StructuredOutputs(regex=REGEX)]


def prompts(n: int) -> list[list[int]]:
    return random_prompts(n, seed=5, max_len=40)


def sampling(i: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured_outputs=CONSTRAINTS[i % 2])


def assert_valid(i: int, text: str) -> None:
    if i % 2 == 0:
        value = json.loads(text)
        assert set(value) == {"id", "tag", "ok"} and 0 <= value["id"] <= 9999, text
        assert len(value["tag"]) <= 12 and isinstance(value["ok"], bool), text
    else:
        assert re.fullmatch(REGEX, text), text


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("llama")


@pytest.fixture(scope="module")
def expected(model_path) -> list[list[int]]:
    llm = LLM(str(model_path), num_blocks=512)
    outs = llm.generate(prompts(16), [sampling(i) for i in range(16)])
    for i, out in enumerate(outs):
        assert out.finish_reason == "stop", out.text  # the grammar ended it, not max_tokens
        assert_valid(i, out.text)
    return [o.token_ids for o in outs]


async def stream_all(endpoint: str, count: int, on_progress) -> list[tuple[list[int], str]]:
    seen = 0
    async with AsyncClient(endpoint, timeout_s=120, heartbeat_s=0.3) as client:

        async def one(i: int, prompt: list[int]) -> tuple[list[int], str]:
            nonlocal seen
            tokens: list[int] = []
            stream = client.stream(prompt_token_ids=prompt, request_id=f"cf-{i}", sampling_params=sampling(i))
            async for delta in stream:
                tokens += delta.token_ids
                seen += len(delta.token_ids)
                await on_progress(seen)
            assert stream.result is not None
            return tokens, stream.result.text

        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts(count))))


def check(got: list[tuple[list[int], str]], expected: list[list[int]]) -> None:
    for i, (_tokens, text) in enumerate(got):
        assert_valid(i, text)
    assert [tokens for tokens, _ in got] == expected


def test_sigkill_of_a_worker_mid_constrained_decode_keeps_outputs_valid_and_exact(
    model_path, expected, tmp_path
):
    sup = start(model_path, workers=2, log_dir=tmp_path)
    try:
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
        killed: list[int] = []

        async def kill_once(seen: int) -> None:
            if seen >= 150 and not killed:
                killed.append(sup.kill_worker(0, signal.SIGKILL))

        got = asyncio.run(stream_all(sup.front_endpoint, 16, kill_once))
        assert killed, "the load finished before the kill: make it longer"
        check(got, expected)
    finally:
        sup.stop()


def test_preemption_by_a_small_pool_keeps_constrained_outputs_valid_and_exact(model_path, expected, tmp_path):
    sup = start(model_path, workers=1, log_dir=tmp_path, num_blocks=16, block_size=8)
    try:

        async def nothing(_seen: int) -> None:
            return None

        got = asyncio.run(stream_all(sup.front_endpoint, 16, nothing))
        metrics = get_text(f"http://127.0.0.1:{sup.config.scheduler_ops_port}/metrics")
        preempted = re.search(r"^pagedserve_preemptions_total (\S+)", metrics, re.M)
        assert preempted and float(preempted.group(1)) > 0, "the pool was meant to force preemption"
        check(got, expected)
    finally:
        sup.stop()
