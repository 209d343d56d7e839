"""Bounded admission under a burst: 1,000 concurrent requests from many clients at a one-worker
deployment whose waiting queue holds 32. Every request either finishes with the exact greedy output
or is refused at once with `overloaded`; none hangs; the ops endpoints answer within 1 s throughout;
the scheduler's memory stays bounded."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from harness.deployment import get_json, start
from harness.greedy_reference import greedy_outputs, random_prompts

from pagedserve import AsyncClient
from pagedserve.ops.deploy import ops_client
from pagedserve.shared.sdk import RequestError

MAX_TOKENS = 16
CLIENTS, PER_CLIENT = 20, 50
MAX_WAITING = 32


def prompts(n: int = 8) -> list[list[int]]:
    return random_prompts(n, seed=5, max_len=20)


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("llama")


@pytest.fixture(scope="module")
def expected(model_path) -> list[list[int]]:
    return greedy_outputs(model_path, prompts(), MAX_TOKENS)


class HealthProbe(threading.Thread):
    """Polls /healthz of the scheduler and the block manager; keeps the slowest answer (inf: none)."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls, self.slowest, self.stop = urls, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            for url in self.urls:
                t0 = time.monotonic()
                took = time.monotonic() - t0 if ops_client.is_ok(url) else float("inf")
                self.slowest = max(self.slowest, took)


async def burst(endpoint: str) -> list[tuple[int, str, list[int] | None, float]]:
    """(prompt index, outcome, tokens, seconds) for every request of every client."""
    clients = [AsyncClient(endpoint, timeout_s=120) for _ in range(CLIENTS)]

    async def one(client: AsyncClient, c: int, i: int) -> tuple[int, str, list[int] | None, float]:
        k = (c * PER_CLIENT + i) % len(prompts())
        t0 = time.monotonic()
        try:
            result = await client.generate(
                prompt_token_ids=prompts()[k], max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True
            )
            return k, "finished", list(result.token_ids), time.monotonic() - t0
        except RequestError as e:
            return k, e.code, None, time.monotonic() - t0

    try:
        calls = [one(cl, c, i) for c, cl in enumerate(clients) for i in range(PER_CLIENT)]
        return await asyncio.wait_for(asyncio.gather(*calls), timeout=240)  # a hang fails here
    finally:
        for cl in clients:
            await cl.close()


def test_a_burst_past_the_waiting_limit_is_refused_overloaded_and_the_rest_is_exact(
    model_path, expected, tmp_path
):
    sup = start(model_path, workers=1, log_dir=tmp_path, max_waiting_requests=MAX_WAITING, max_num_seqs=8)
    probe = HealthProbe([f"{sup.scheduler_ops_url}/healthz", f"{sup.block_manager_ops_url}/healthz"])
    try:
        rss_before = get_json(f"{sup.scheduler_ops_url}/process")["rss_bytes"]
        probe.start()
        outcomes = asyncio.run(burst(sup.front_endpoint))
        probe.stop.set()
        probe.join()
        codes = {code for _, code, _, _ in outcomes}
        assert codes == {"finished", "overloaded"}, codes
        assert len(outcomes) == CLIENTS * PER_CLIENT
        for k, code, tokens, _ in outcomes:
            if code == "finished":
                assert tokens == expected[k]
        refused = [took for _, code, _, took in outcomes if code == "overloaded"]
        assert len(refused) > 500  # the queue holds 32: most of a 1,000-request burst is refused
        assert max(refused) < 5.0, "a refusal must come at once, not after waiting"
        assert probe.slowest < 1.0, f"an ops endpoint took {probe.slowest:.2f} s"
        rss_after = get_json(f"{sup.scheduler_ops_url}/process")["rss_bytes"]
        assert rss_after < rss_before * 1.25, (rss_before, rss_after)
        requests = get_json(f"{sup.scheduler_ops_url}/requests")
        assert requests["waiting"] == requests["running"] == 0
    finally:
        probe.stop.set()
        sup.stop()
