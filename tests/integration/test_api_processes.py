"""`api_processes=2`: two API processes on one port (SO_REUSEPORT), each its own SDK client. SIGKILL
one in the middle of many streams: the streams it held break, every stream the other held runs to
its end, and the supervisor restarts the dead one."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
from harness.deployment import start_with_api, wait_for

STREAMS = 16
MAX_TOKENS = 120


async def one_stream(base_url: str, model: str, i: int, started: asyncio.Event, counts: list[int]) -> str:
    """'done' (to max_tokens, then [DONE]) or 'broken' (the connection died under it)."""
    finish = None
    body = {
        "model": model,
        "prompt": list(range(5 + i, 25 + i)),
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    # One client per stream: a connection of its own, which the kernel gives to either process.
    async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=5)) as http:
        try:
            async with http.stream("POST", f"{base_url}/completions", json=body) as reply:
                assert reply.status_code == 200, await reply.aread()
                async for line in reply.aiter_lines():
                    if line == "data: [DONE]":
                        return "done" if finish == "length" else f"ended: {finish}"
                    if line.startswith("data: "):
                        choice = json.loads(line[6:])["choices"][0]
                        finish = choice.get("finish_reason") or finish
                        counts[i] += 1
                        if counts[i] >= 5:
                            started.set()
        except (httpx.TransportError, httpx.StreamError):
            return "broken"
    return "broken"  # the body ended without [DONE]


def test_killing_one_api_process_leaves_the_other_processes_streams_intact(tiny_model, tmp_path):
    sup, base = start_with_api(tiny_model("llama"), tmp_path, api_processes=2, num_blocks=512)
    try:

        def both_up() -> bool:
            logs = [(tmp_path / f"{n}.log") for n in ("api", "api-1")]
            healthy = all(p.exists() and "api_starting" in p.read_text() for p in logs)
            try:
                return healthy and httpx.get(f"{base}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_for(both_up, 60), "the two API processes did not come up"
        time.sleep(2.0)  # the second one's SDK client connected too

        model = httpx.get(f"{base}/v1/models", timeout=5).json()["data"][0]["id"]

        async def run() -> list[str]:
            started = asyncio.Event()
            counts = [0] * STREAMS
            tasks = [
                asyncio.create_task(one_stream(f"{base}/v1", model, i, started, counts))
                for i in range(STREAMS)
            ]
            await asyncio.wait_for(started.wait(), 60)
            sup.kill("api-1", signal.SIGKILL)
            return await asyncio.gather(*tasks)

        outcomes = asyncio.run(run())
        assert set(outcomes) <= {"done", "broken"}, outcomes
        assert "broken" in outcomes, "no stream was on the killed process (the kernel gave it none?)"
        assert "done" in outcomes, "every stream died with one API process"
        assert wait_for(lambda: sup.restarts("api-1") == 1 and sup.pid("api-1") is not None, 15)
        assert sup.restarts("api") == 0
    finally:
        sup.stop()
