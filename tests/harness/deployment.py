"""Start a real pagedserve deployment (block manager, scheduler, N workers as processes) on free
loopback ports, for integration and chaos tests."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
import urllib.request
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import Any, TypeVar

from pagedserve.ops.deploy.supervisor import Supervisor
from pagedserve.shared.config import ServeConfig


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def sharded_ports(shards: int, count: int = 6) -> list[int]:
    """`count` ports for a sharded deployment (front, workers, block manager, scheduler ops, block-manager
    ops, and one more), every shard's moved copy of them free too (ops/deploy/shards.py adds 100 x
    (i + 1)). Taken below Linux's ephemeral range, where processes that bind port 0 (Ray's, a peer
    test's) never land on them meanwhile."""
    from pagedserve.ops.deploy.shards import SHARD_PORT_STEP

    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 30_000 - SHARD_PORT_STEP * (shards + 1), count)
        wanted = [base + k + SHARD_PORT_STEP * i for k in range(count) for i in range(shards + 1)]
        if all(_bindable(port) for port in wanted):
            return [base + k for k in range(count)]
    raise RuntimeError(f"no {count} ports free below 30000 for {shards} shards")


def sharded_config(model: Path | str, shards: int, **overrides: Any) -> ServeConfig:
    """deployment_config on ports that every shard's moved copy finds free (sharded_ports); the sixth
    is the router's ops port."""
    front, workers, bm, sched_ops, bm_ops, router_ops = sharded_ports(shards)
    ports = {
        "front_endpoint": f"tcp://127.0.0.1:{front}",
        "worker_endpoint": f"tcp://127.0.0.1:{workers}",
        "block_manager_endpoint": f"tcp://127.0.0.1:{bm}",
        "scheduler_ops_port": sched_ops,
        "block_manager_ops_port": bm_ops,
        "router_ops_port": router_ops,
    }
    return deployment_config(model, **(ports | overrides))


def simulated_model(root: Path, max_len: int = 512) -> Path:
    """A model folder with only a config.json: what simulated workers (simulate_step_ms) need."""
    model = root / "model"
    model.mkdir()
    config = {"vocab_size": 320, "max_position_embeddings": max_len, "eos_token_id": 2}
    (model / "config.json").write_text(json.dumps(config))
    return model


def deployment_config(model: Path | str, **overrides: Any) -> ServeConfig:
    front, workers, bm, sched_ops, bm_ops = free_ports(5)
    fields: dict[str, Any] = {
        "model": str(model),
        "front_endpoint": f"tcp://127.0.0.1:{front}",
        "worker_endpoint": f"tcp://127.0.0.1:{workers}",
        "block_manager_endpoint": f"tcp://127.0.0.1:{bm}",
        "scheduler_ops_port": sched_ops,
        "block_manager_ops_port": bm_ops,
        "num_blocks": 256,
        "num_threads": 1,
        "log_format": "json",
        # No warm standby worker by default: it doubles each deployment's start-up work, and the
        # tests that need one (fast restarts) ask for it.
        "standby_workers": 0,
        "standby_api": 0,  # likewise the API's: tests of a fast API restart ask for it
    }
    fields.update(overrides)
    return ServeConfig(**fields)


def start(
    model: Path | str,
    workers: int,
    log_dir: Path,
    policy: Any = None,
    failpoints: dict[str, str] | None = None,
    rearm_failpoints: bool = True,
    api: bool = False,
    **overrides: Any,
) -> Supervisor:
    """`failpoints`: child name -> spec (shared/failpoints.py), armed in that child only (and in its
    restarts unless `rearm_failpoints` is false). `api`: the supervisor runs the API processes too."""
    sup = Supervisor(
        deployment_config(model, **overrides),
        workers=workers,
        log_dir=log_dir,
        policy=policy,
        failpoints=failpoints,
        rearm_failpoints=rearm_failpoints,
        api=api,
    )
    sup.start()
    try:
        sup.wait_ready(timeout_s=120)
    except BaseException:
        sup.stop()
        raise
    return sup


def start_with_api(model: Path | str, log_dir: Path, **overrides: Any) -> tuple[Supervisor, str]:
    """A deployment whose supervisor runs the API too, on a free port, its one worker ready:
    (the supervisor, the API's base URL). The caller stops it."""
    (api_port,) = free_ports(1)
    sup = start(model, workers=1, log_dir=log_dir, api=True, api_port=api_port, **overrides)
    if not wait_for(lambda: workers_ready(sup), 30):
        sup.stop()
        raise TimeoutError("the worker did not become ready in 30 s")
    return sup, f"http://127.0.0.1:{api_port}"


def get_json(url: str) -> Any:
    with closing(urllib.request.urlopen(url, timeout=10)) as resp:
        return json.loads(resp.read())


def get_text(url: str) -> str:
    with closing(urllib.request.urlopen(url, timeout=10)) as resp:
        return resp.read().decode()


def metric_sum(ops_url: str, name: str) -> float:
    """A Prometheus metric of an ops server, summed over its labels (0 when it has no sample yet)."""
    lines = get_text(f"{ops_url}/metrics").splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith((f"{name} ", f"{name}{{")))


def blocks(sup: Supervisor) -> dict[str, Any]:
    return get_json(f"{sup.block_manager_ops_url}/blocks")


def workers_ready(sup: Supervisor) -> list[str]:
    try:
        return get_json(f"{sup.scheduler_ops_url}/readyz")["workers"]
    except Exception:
        return []


T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float, poll_s: float = 0.1) -> T:
    """Poll until `predicate()` is truthy; its last value (falsy when `timeout_s` ran out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(poll_s)
    return predicate()


async def stream_greedy(
    endpoint: str,
    prompts: list[list[int]],
    max_tokens: int,
    request_prefix: str,
    on_progress: Callable[[int], Awaitable[None]],
    loras: list[str | None] | None = None,
    **client_options: Any,
) -> list[tuple[list[int], list[int]]]:
    """Stream every prompt at once, greedy with EOS ignored, ids `<request_prefix>-<i>`: per prompt
    (its deltas concatenated, its final tokens); `await on_progress(total tokens seen)` per delta.
    loras: per prompt the LoRA adapter it runs with (None: the base model)."""
    from pagedserve import AsyncClient

    seen = 0
    async with AsyncClient(endpoint, **({"timeout_s": 120} | client_options)) as client:

        async def one(i: int, prompt: list[int]) -> tuple[list[int], list[int]]:
            nonlocal seen
            streamed: list[int] = []
            stream = client.stream(
                prompt_token_ids=prompt,
                max_tokens=max_tokens,
                temperature=0.0,
                ignore_eos=True,
                request_id=f"{request_prefix}-{i}",
                **({} if loras is None or loras[i] is None else {"lora": loras[i]}),
            )
            async for delta in stream:
                streamed += delta.token_ids
                seen += len(delta.token_ids)
                await on_progress(seen)
            assert stream.result is not None  # a stream that ends without error ends with its result
            return streamed, list(stream.result.token_ids)

        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def assert_no_leak(sup: Supervisor, expect_pools: int) -> None:
    """Once the pools settle: `expect_pools` of them, every block free, none leaked, invariants ok."""

    def settled():
        snap = blocks(sup)
        pools = snap["pools"]
        whole = all(p["totals"]["free"] == p["totals"]["total"] for p in pools)
        return snap if len(pools) == expect_pools and whole else None

    snap = wait_for(settled, 15) or blocks(sup)
    assert snap["totals"]["leaked"] == 0, snap["totals"]
    assert len(snap["pools"]) == expect_pools
    assert all(p["totals"]["free"] == p["totals"]["total"] for p in snap["pools"]), snap["totals"]
    assert snap["invariants"]["ok"], snap["invariants"]
