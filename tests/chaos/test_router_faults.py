"""Chaos behind the router: two scheduler shards (each its block manager and one simulated worker) and
`pagedserve router` in front, as `pagedserve up --schedulers 2` runs them.

- The router SIGKILLed mid-stream: its supervisor restarts it, every client reconnects and re-attaches,
  the new router finds each request's shard (Locate), and the streams end with the tokens of a run
  without the fault.
- A shard's scheduler SIGKILLed mid-stream: the router sees the connection drop, and that shard's
  requests start over on the other shard (the clients keep what they have by offset): same tokens.
Nothing is lost, and neither shard leaks a block. Workers are simulated (deterministic tokens from the
prompt): what is under test is the control plane."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from harness.deployment import (
    assert_no_leak,
    get_json,
    get_text,
    sharded_config,
    simulated_model,
    stream_greedy,
    wait_for,
)

from pagedserve.ops.deploy.shards import ShardedDeployment

REQUESTS = 6
MAX_TOKENS = 150
PROMPTS = [[11 + i, 12, 13, 14, 15 + i] for i in range(REQUESTS)]


def sharded(tmp_path: Path, **overrides) -> ShardedDeployment:
    config = sharded_config(
        simulated_model(tmp_path),
        2,
        simulate_step_ms=10,
        lease_ttl_s=3.0,
        lease_renew_interval_s=1.0,
        reap_interval_s=0.25,
        **overrides,
    )
    deployment = ShardedDeployment(config, schedulers=2, workers=1, log_dir=tmp_path / "logs").start()
    try:
        deployment.wait_ready(timeout_s=90)
    except BaseException:
        deployment.stop()
        raise
    return deployment


def router_events(deployment: ShardedDeployment) -> dict[str, float]:
    prefix = 'pagedserve_router_events_total{event="'
    return {
        line[len(prefix) :].split('"')[0]: float(line.split()[-1])
        for line in get_text(f"{deployment.scheduler_ops_url}/metrics").splitlines()
        if line.startswith(prefix)
    }


def run(deployment: ShardedDeployment, prefix: str, on_progress) -> list[tuple[list[int], list[int]]]:
    return asyncio.run(stream_greedy(deployment.front_endpoint, PROMPTS, MAX_TOKENS, prefix, on_progress))


async def _nothing(seen: int) -> None:
    return None


def test_router_and_shard_scheduler_kills_lose_nothing_and_change_no_token(tmp_path):
    deployment = sharded(tmp_path)
    try:
        want = [final for _, final in run(deployment, "calm", _nothing)]
        assert all(len(tokens) == MAX_TOKENS for tokens in want)
        shards = get_json(f"{deployment.scheduler_ops_url}/shards")["shards"]
        assert [s["alive"] for s in shards] == [True, True]

        killed: dict[str, float] = {}

        def killer(victim: str, at_tokens: int):
            async def on_progress(seen: int) -> None:
                if seen >= at_tokens and victim not in killed:
                    deployment.kill(victim, signal.SIGKILL)
                    killed[victim] = time.monotonic()

            return on_progress

        got = run(deployment, "router-kill", killer("router", REQUESTS * 20))
        assert "router" in killed and deployment.restarts("router") == 1
        assert [streamed for streamed, _ in got] == want
        assert [final for _, final in got] == want
        assert router_events(deployment)["locates"] >= REQUESTS  # the new router asked for every one

        got = run(deployment, "shard-kill", killer("shard-0/scheduler", REQUESTS * 20))
        assert "shard-0/scheduler" in killed
        assert [streamed for streamed, _ in got] == want
        assert [final for _, final in got] == want
        assert router_events(deployment)["replaced"] >= 1
        assert router_events(deployment)["shards_lost_disconnected"] == 1

        def both_alive() -> bool:
            shards = get_json(f"{deployment.scheduler_ops_url}/shards")["shards"]
            return all(s["alive"] for s in shards)

        assert wait_for(both_alive, 60), "the restarted shard never answered the router again"

        for shard in deployment.shards:
            assert_no_leak(shard, expect_pools=1)
    finally:
        deployment.stop()
