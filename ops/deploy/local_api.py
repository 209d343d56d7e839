"""A whole local deployment on free loopback ports, for benchmarks, chaos runs and client checks: its
config (`local_config`), and the deployment with its API started and stopped around a block.

with serving_api("smollm2-135m", runner="embed") as base:   # base: http://127.0.0.1:PORT
    httpx.post(f"{base}/v1/embeddings", ...)
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pagedserve.ops.deploy.process_group import RestartPolicy
from pagedserve.ops.deploy.supervisor import Supervisor
from pagedserve.shared.config import ServeConfig


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def local_config(model: str, **settings: Any) -> ServeConfig:
    """`model` served on free loopback ports (the API's too, used or not), JSON logs; `settings` are
    any other ServeConfig fields, and override those."""
    front, workers, bm, sched_ops, bm_ops, api_port, router_ops = free_ports(7)
    loopback = {
        "front_endpoint": f"tcp://127.0.0.1:{front}",
        "worker_endpoint": f"tcp://127.0.0.1:{workers}",
        "block_manager_endpoint": f"tcp://127.0.0.1:{bm}",
        "scheduler_ops_port": sched_ops,
        "block_manager_ops_port": bm_ops,
        "api_port": api_port,
        "router_ops_port": router_ops,
        "log_format": "json",
    }
    return ServeConfig(model=model, **(loopback | settings))


@contextmanager
def serving_api(
    model: str,
    *,
    workers: int = 1,
    policy: RestartPolicy | None = None,
    ready_timeout_s: float = 600,
    **settings: Any,
) -> Iterator[str]:
    """Start the deployment, yield its API's base URL once healthy (the Supervisor's readiness waits
    for the API's /health too), stop every process after."""
    config = local_config(model, **settings)
    log_dir = Path(tempfile.mkdtemp(prefix="pagedserve-local-"))
    sup = Supervisor(config, workers=workers, log_dir=log_dir, policy=policy, api=True)
    sup.start()
    try:
        sup.wait_ready(timeout_s=ready_timeout_s)
        yield f"http://127.0.0.1:{config.api_port}"
    finally:
        sup.stop()
