"""A whole local deployment with its API on free loopback ports, for benchmarks and client checks.

with serving_api("smollm2-135m", runner="embed") as base:   # base: http://127.0.0.1:PORT
    httpx.post(f"{base}/v1/embeddings", ...)
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from pagedserve.ops.chaos.deployment import free_ports
from pagedserve.ops.deploy.process_group import RestartPolicy
from pagedserve.ops.deploy.supervisor import Supervisor
from pagedserve.shared.config import ServeConfig


def local_config(model: str, **settings: Any) -> ServeConfig:
    """`model` served on free loopback ports, JSON logs; `settings` are any other ServeConfig fields."""
    front, workers, bm, sched_ops, bm_ops, api_port = free_ports(6)
    return ServeConfig(
        model=model,
        front_endpoint=f"tcp://127.0.0.1:{front}",
        worker_endpoint=f"tcp://127.0.0.1:{workers}",
        block_manager_endpoint=f"tcp://127.0.0.1:{bm}",
        scheduler_ops_port=sched_ops,
        block_manager_ops_port=bm_ops,
        api_port=api_port,
        log_format="json",
        **settings,
    )


def wait_healthy(base: str, timeout_s: float) -> None:
    """Until `base`/health answers 200 (the scheduler answers and has a ready worker)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base}/health did not answer 200 within {timeout_s:.0f} s")
        time.sleep(0.2)


@contextmanager
def serving_api(
    model: str,
    *,
    workers: int = 1,
    policy: RestartPolicy | None = None,
    ready_timeout_s: float = 600,
    **settings: Any,
) -> Iterator[str]:
    """Start the deployment, yield its API's base URL once healthy, stop every process after."""
    config = local_config(model, **settings)
    log_dir = Path(tempfile.mkdtemp(prefix="pagedserve-local-"))
    sup = Supervisor(config, workers=workers, log_dir=log_dir, policy=policy, api=True)
    sup.start()
    try:
        sup.wait_ready(timeout_s=ready_timeout_s)
        base = f"http://127.0.0.1:{config.api_port}"
        wait_healthy(base, ready_timeout_s)
        yield base
    finally:
        sup.stop()
