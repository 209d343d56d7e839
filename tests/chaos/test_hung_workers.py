"""Hung workers (SIGSTOP, later SIGCONT) on real processes: a pause shorter than the worker timeout
costs only latency; a longer one gets the worker declared lost, its requests recompute on the other
worker with exact outputs and whole streams, and once resumed it is fenced (nothing it sends from
before is believed), reset, and rejoins clean, without a restart. The same holds for a worker that
hangs with a computed step result not yet sent."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest
from harness.deployment import blocks, get_text, start, stream_greedy, wait_for, workers_ready
from harness.greedy_reference import greedy_outputs, random_prompts

MAX_TOKENS = 100


def prompts(n: int, seed: int = 11) -> list[list[int]]:
    return random_prompts(n, seed, max_len=40)


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("llama")


@pytest.fixture(scope="module")
def expected(model_path) -> list[list[int]]:
    return greedy_outputs(model_path, prompts(16), MAX_TOKENS)


async def stream_all(endpoint: str, count: int, on_tokens, tag: str) -> list[tuple[list[int], list[int]]]:
    """(concatenated stream deltas, final tokens) per request; on_tokens(total seen) as they come."""
    return await stream_greedy(endpoint, prompts(count), MAX_TOKENS, f"hung-{tag}", on_tokens)


def workers_lost(sup) -> float:
    for line in get_text(f"{sup.scheduler_ops_url}/metrics").splitlines():
        if line.startswith("pagedserve_workers_lost_total "):
            return float(line.split()[1])
    return 0.0


def assert_whole(sup) -> None:
    def whole():
        snap = blocks(sup)
        pools = snap["pools"]
        return len(pools) == 2 and all(p["totals"]["free"] == p["totals"]["total"] for p in pools)

    assert wait_for(whole, 20), blocks(sup)["totals"]
    snap = blocks(sup)
    assert snap["totals"]["leaked"] == 0 and snap["invariants"]["ok"], snap["invariants"]


def assert_exact(got, expected) -> None:
    for (streamed, final), want in zip(got, expected, strict=True):
        assert streamed == final, "the stream duplicated or missed a token"
        assert final == want


def pause_worker_0(sup, pause_s: float, after_tokens: int, state: dict):
    async def on_tokens(seen: int) -> None:
        if seen >= after_tokens and "paused_at" not in state:
            sup.kill_worker(0, signal.SIGSTOP)
            state["paused_at"] = time.monotonic()
            # A timer thread, not the event loop: the load may be over before the pause is.
            threading.Timer(
                pause_s, lambda: (sup.kill_worker(0, signal.SIGCONT), state.update(resumed=True))
            ).start()

    return on_tokens


def test_a_pause_shorter_than_the_worker_timeout_costs_only_latency(model_path, expected, tmp_path):
    sup = start(model_path, workers=2, log_dir=tmp_path)
    try:
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
        state: dict = {}
        got = asyncio.run(stream_all(sup.front_endpoint, 16, pause_worker_0(sup, 0.5, 150, state), "short"))
        assert state.get("resumed")
        assert_exact(got, expected)
        assert workers_lost(sup) == 0  # 0.5 s < worker_timeout_s (1.5 s): never declared lost
        assert_whole(sup)
    finally:
        sup.stop()


def test_a_long_pause_moves_its_requests_and_the_worker_rejoins_without_a_restart(
    model_path, expected, tmp_path
):
    sup = start(model_path, workers=2, log_dir=tmp_path)
    try:
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
        state: dict = {}
        got = asyncio.run(stream_all(sup.front_endpoint, 16, pause_worker_0(sup, 5.0, 150, state), "long"))
        assert "paused_at" in state
        assert_exact(got, expected)  # finished on worker-1, most of them while worker-0 was stopped
        assert workers_lost(sup) >= 1
        assert wait_for(lambda: state.get("resumed"), 10)
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 15), workers_ready(sup)
        assert sup.restarts("worker-0") == 0  # the same process, reset and rejoined
        assert_whole(sup)
        # It serves again, exactly.
        again = asyncio.run(stream_all(sup.front_endpoint, 16, lambda seen: asyncio.sleep(0), "after"))
        assert_exact(again, expected)
    finally:
        sup.stop()


def test_a_worker_hung_with_a_result_unsent_is_not_believed_when_it_wakes(model_path, expected, tmp_path):
    # worker-0 SIGSTOPs itself before sending the result of its 6th step that sampled tokens.
    sup = start(
        model_path,
        workers=2,
        log_dir=tmp_path,
        failpoints={"worker-0": "worker.stop_before_result=5*off->1*stop"},
    )
    try:
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
        state: dict = {}

        async def resume_once_lost(seen: int) -> None:
            if "resumed" not in state and "worker-0" not in workers_ready(sup) and workers_lost(sup) >= 1:
                state["resumed"] = True
                await asyncio.sleep(0.5)  # its requests have moved on by now
                sup.kill_worker(0, signal.SIGCONT)

        got = asyncio.run(stream_all(sup.front_endpoint, 16, resume_once_lost, "unsent"))
        assert state.get("resumed"), "worker-0 never hung: the fault hook did not fire"
        assert_exact(got, expected)
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 15), workers_ready(sup)
        assert sup.restarts("worker-0") == 0
        assert_whole(sup)
        again = asyncio.run(stream_all(sup.front_endpoint, 16, lambda seen: asyncio.sleep(0), "after"))
        assert_exact(again, expected)
    finally:
        sup.kill_worker(0, signal.SIGCONT)
        sup.stop()
