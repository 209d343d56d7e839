"""A step that goes unanswered while its worker's heartbeats keep coming (the shape of the 120 s
hang): the scheduler's step timeout, measured from that worker's own step times, moves its requests
to the other worker long before the client's default timeouts; on the way it dumps the scheduler's
and the worker's stacks into their logs, and the worker's dump shows where it was stuck."""

from __future__ import annotations

import asyncio
import time

import pytest
from harness.deployment import start, wait_for, workers_ready
from harness.greedy_reference import greedy_outputs, random_prompts

from pagedserve import AsyncClient
from pagedserve.shared.sdk.client import DEFAULT_IDLE_TIMEOUT_S

MAX_TOKENS = 60
HOLD_S = 40.0  # how long worker-0 sits on one step result (its heartbeats go on)


def prompts() -> list[list[int]]:
    return random_prompts(12, 5, max_len=30)


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("llama")


def thread_stacks(dump: str) -> list[str]:
    """One faulthandler dump split per thread (each block starts 'Thread 0x' or 'Current thread 0x')."""
    blocks: list[list[str]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([])
        elif line.startswith("{"):  # the next log line: the dump is over
            if blocks:
                break
            continue
        if blocks:
            blocks[-1].append(line)
    return ["\n".join(b) for b in blocks]


async def stream_with_sdk_defaults(endpoint: str) -> list[list[int]]:
    async with AsyncClient(endpoint) as client:  # the SDK's default timeouts, nothing shortened

        async def one(i: int, prompt: list[int]) -> list[int]:
            tokens: list[int] = []
            stream = client.stream(
                prompt_token_ids=prompt,
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                ignore_eos=True,
                request_id=f"st-{i}",
            )
            async for delta in stream:
                tokens += delta.token_ids
            assert stream.result is not None and tokens == list(stream.result.token_ids)
            return tokens

        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts())))


def test_a_step_held_past_its_measured_timeout_moves_its_requests_and_dumps_stacks(model_path, tmp_path):
    expected = greedy_outputs(model_path, prompts(), MAX_TOKENS)
    sup = start(
        model_path,
        workers=2,
        log_dir=tmp_path,
        step_timeout_floor_s=3.0,  # the floor only; the timeout in force comes from measured steps
        # 20 replies go out normally (enough steps measured), then one is held for HOLD_S.
        failpoints={"worker-0": f"worker.delay_reply=20*off->1*sleep({int(HOLD_S * 1000)})"},
    )
    try:
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
        t0 = time.monotonic()
        got = asyncio.run(stream_with_sdk_defaults(sup.front_endpoint))
        took = time.monotonic() - t0
        assert got == expected
        # They finished on worker-1, not after worker-0 let go of its step.
        assert took < HOLD_S < DEFAULT_IDLE_TIMEOUT_S, took
        scheduler_log = (tmp_path / "scheduler.log").read_text()
        assert '"event": "step_timeout"' in scheduler_log and '"worker_id": "worker-0"' in scheduler_log
        assert "step_overdue_dumping_stacks" in scheduler_log
        assert "Thread 0x" in scheduler_log  # the scheduler's own stacks
        worker_log = (tmp_path / "worker-0.log").read_text()
        assert "failpoint_fired" in worker_log and "dumping_stacks" in worker_log
        # The worker's dump names the place its step thread was stuck in.
        assert "failpoints.py" in worker_log.split("dumping_stacks", 1)[1]
    finally:
        sup.stop()


def test_a_dropped_execute_is_noticed_by_the_step_timeout_and_the_dump_shows_the_worker_idle(
    model_path, tmp_path
):
    """The 120 s hang's shape: an Execute that never runs, the worker idle and heartbeating. Depth 1,
    so no later step names a request the worker never saw."""
    expected = greedy_outputs(model_path, prompts(), MAX_TOKENS)
    sup = start(
        model_path,
        workers=2,
        log_dir=tmp_path,
        pipeline_depth=1,
        step_timeout_floor_s=3.0,
        failpoints={"worker-0": "worker.drop_execute=20*off->1*return"},
    )
    try:
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
        t0 = time.monotonic()
        got = asyncio.run(stream_with_sdk_defaults(sup.front_endpoint))
        assert got == expected
        assert time.monotonic() - t0 < 60.0  # the old fixed timeout alone was 120 s
        assert '"event": "step_timeout"' in (tmp_path / "scheduler.log").read_text()
        dump = (tmp_path / "worker-0.log").read_text().split("dumping_stacks", 1)[1]
        # Its step thread waits in the receive loop's poll: the Execute never reached the runner.
        (step_thread,) = [t for t in thread_stacks(dump) if " in serve" in t]
        assert " in poll" in step_thread and " in execute" not in step_thread, step_thread
    finally:
        sup.stop()
