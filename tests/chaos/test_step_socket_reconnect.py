"""A worker's step connection dropped and re-made while it serves (the ROUTER_HANDOVER mechanism of
docs/failure-model.md): steps sent on the old connection can vanish with it, no error anywhere, and
before the fix only the step timeout noticed. Now the worker says hello on its new connection at
once, and the scheduler requeues what was in flight and rejoins it with a new generation."""

from __future__ import annotations

import asyncio
import subprocess
import time
from urllib.parse import urlparse

from harness.deployment import start, wait_for, workers_ready
from harness.greedy_reference import greedy_outputs, random_prompts

from pagedserve import AsyncClient

MAX_TOKENS = 120
CUTS = 5  # connection cuts, 0.5 s apart: at least one lands with a step in flight
FLOOR_S = 40.0  # the step timeout cannot fire within the test's bound


def cut_worker_connections(worker_endpoint: str) -> None:
    """Abort every TCP connection to the scheduler's worker port (the workers' side): `ss -K`."""
    port = urlparse(worker_endpoint).port
    subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", str(port)], check=True, capture_output=True)


async def stream_while_cutting(sup) -> tuple[list[list[int]], float]:
    async with AsyncClient(sup.front_endpoint) as client:

        async def one(i: int, prompt: list[int]) -> list[int]:
            tokens: list[int] = []
            async for delta in client.stream(
                prompt_token_ids=prompt, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True
            ):
                tokens += delta.token_ids
            return tokens

        streams = asyncio.gather(*(one(i, p) for i, p in enumerate(random_prompts(6, 7, max_len=20))))
        await asyncio.sleep(2.0)  # under way
        cut_at = time.monotonic()
        for _ in range(CUTS):
            cut_worker_connections(sup.config.worker_endpoint)
            await asyncio.sleep(0.5)
        got = await asyncio.wait_for(streams, timeout=FLOOR_S + 60)
        return got, time.monotonic() - cut_at


def test_a_reconnected_step_socket_requeues_at_once_instead_of_waiting_for_the_step_timeout(
    tiny_model, tmp_path
):
    model = tiny_model("llama")
    sup = start(model, workers=1, log_dir=tmp_path, step_timeout_floor_s=FLOOR_S, step_timeout_s=FLOOR_S)
    try:
        assert wait_for(lambda: len(workers_ready(sup)) == 1, 60)
        got, after_cut = asyncio.run(stream_while_cutting(sup))
    finally:
        sup.stop()
    log = (tmp_path / "scheduler.log").read_text()
    assert "step_timeout" not in log and "step unanswered" not in log, "waited for the step timeout"
    assert "step socket reconnected" in log
    assert after_cut < FLOOR_S / 2, f"streams ended {after_cut:.1f} s after the first cut"
    assert got == greedy_outputs(model, random_prompts(6, 7, max_len=20), MAX_TOKENS)
