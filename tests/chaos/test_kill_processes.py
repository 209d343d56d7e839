"""Chaos: real processes are SIGKILLed mid-run; no request is lost or changed, no block leaks."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from harness.deployment import assert_no_leak, blocks, start, stream_greedy, wait_for, workers_ready
from harness.greedy_reference import greedy_outputs, random_prompts

from pagedserve import AsyncClient
from pagedserve.ops.deploy.process_group import RestartPolicy
from pagedserve.shared.sdk import RequestError

MAX_TOKENS = 120


def prompts(n: int, seed: int = 3) -> list[list[int]]:
    return random_prompts(n, seed, max_len=50)


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("llama")


@pytest.fixture(scope="module")
def expected(model_path) -> list[list[int]]:
    return greedy_outputs(model_path, prompts(24), MAX_TOKENS)


async def run_load(endpoint: str, count: int, on_progress, timeout_s: float = 120) -> list[list[int]]:
    """Stream `count` greedy requests; call on_progress(total_tokens_seen) as tokens arrive."""
    got = await stream_greedy(
        endpoint,
        prompts(count),
        MAX_TOKENS,
        "chaos",
        on_progress,
        timeout_s=timeout_s,
        heartbeat_s=0.3,
        reconnect_after_s=1.5,
    )
    return [streamed for streamed, _ in got]


def test_sigkill_one_of_two_workers_mid_decode_loses_nothing(model_path, expected, tmp_path):
    sup = start(model_path, workers=2, log_dir=tmp_path)
    try:
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
        killed: dict[str, float] = {}

        async def kill_once(seen: int) -> None:
            if seen >= 200 and not killed:
                killed["pid"] = sup.kill_worker(0, signal.SIGKILL)
                killed["at"] = time.monotonic()

        got = asyncio.run(run_load(sup.front_endpoint, 24, kill_once))
        assert killed, "the load finished before the kill: make it longer"
        assert got == expected
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)  # the restarted worker is back
        assert_no_leak(sup, expect_pools=2)
    finally:
        sup.stop()


def test_sigkill_scheduler_leases_are_reclaimed_and_resubmitted_requests_finish(
    model_path, expected, tmp_path
):
    ttl = 3.0
    sup = start(
        model_path,
        workers=1,
        log_dir=tmp_path,
        lease_ttl_s=ttl,
        lease_renew_interval_s=1.0,
        reap_interval_s=0.25,
    )
    try:
        state: dict[str, object] = {}

        async def kill_once(seen: int) -> None:
            if seen >= 150 and "at" not in state:
                snap = blocks(sup)
                state["owners"] = {lease["owner"] for lease in snap["leases"]}
                state["held"] = snap["totals"]["used"]
                sup.kill("scheduler", signal.SIGKILL)
                state["at"] = time.monotonic()
                # Measure the reclaim while the load waits for the new scheduler.
                loop = asyncio.get_running_loop()
                state["reclaimed_after"] = await loop.run_in_executor(
                    None, wait_reclaimed, sup, state["owners"], ttl + 3
                )
                state["reclaimed_after"] -= state["at"]

        got = asyncio.run(run_load(sup.front_endpoint, 16, kill_once))
        assert "at" in state and state["held"] > 0 and state["owners"]
        assert state["reclaimed_after"] <= ttl + 1.0, f"reclaimed after {state['reclaimed_after']:.2f}s"
        assert got == expected[:16]
        assert sup.restarts("scheduler") == 1
        assert_no_leak(sup, expect_pools=1)
    finally:
        sup.stop()


def wait_reclaimed(sup, owners: set[str], timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = blocks(sup)
        if not any(lease["owner"] in owners for lease in snap["leases"]):
            return time.monotonic()
        time.sleep(0.05)
    return float("inf")


def test_kill_and_restart_block_manager_every_request_finishes(model_path, expected, tmp_path):
    sup = start(model_path, workers=1, log_dir=tmp_path, rpc_timeout_s=1.0)
    try:
        killed: dict[str, float] = {}

        async def kill_once(seen: int) -> None:
            if seen >= 150 and not killed:
                killed["pid"] = sup.kill("block-manager", signal.SIGKILL)

        got = asyncio.run(run_load(sup.front_endpoint, 16, kill_once))
        assert killed
        assert got == expected[:16]
        assert sup.restarts("block-manager") == 1
        assert_no_leak(sup, expect_pools=1)
    finally:
        sup.stop()


def test_no_live_worker_ends_requests_with_no_workers_then_a_new_worker_serves(model_path, tmp_path):
    # Workers come back only after 8 s, so the requests below time out first.
    sup = start(
        model_path, workers=2, log_dir=tmp_path, policy=RestartPolicy(backoff_s=8.0, max_backoff_s=8.0)
    )
    try:
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
        sup.kill_worker(0)
        sup.kill_worker(1)
        assert wait_for(lambda: not workers_ready(sup), 5)

        async def submit_all() -> list[tuple[str, float]]:
            async with AsyncClient(sup.front_endpoint, timeout_s=30) as client:

                async def one(i: int) -> tuple[str, float]:
                    t0 = time.monotonic()
                    try:
                        await client.generate(prompt_token_ids=[5, 6, 7 + i], max_tokens=4, timeout_s=2.0)
                        return "finished", time.monotonic() - t0
                    except RequestError as exc:
                        return exc.code, time.monotonic() - t0

                return await asyncio.gather(*(one(i) for i in range(4)))

        outcomes = asyncio.run(submit_all())
        assert [code for code, _ in outcomes] == ["no_workers"] * 4
        assert all(elapsed < 2.0 + 1.5 for _, elapsed in outcomes), outcomes
        assert wait_for(lambda: len(workers_ready(sup)) >= 1, 30)

        async def one_more():
            async with AsyncClient(sup.front_endpoint, timeout_s=30) as client:
                return await client.generate(prompt_token_ids=[5, 6, 7], max_tokens=4, temperature=0.0)

        assert len(asyncio.run(one_more()).token_ids) > 0
    finally:
        sup.stop()
