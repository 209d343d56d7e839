"""The deployment `pagedserve chaos` runs against: one it starts itself, or one already running.

With --start N, a Supervisor on free loopback ports (block manager, scheduler, N workers). Without,
a running `pagedserve up` (endpoints from flags, else PAGEDSERVE_* variables and the defaults), or
with --docker a running `docker compose` project, whose worker containers are the victims.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedserve.ops.chaos.targets import ContainerWorkers, ProcessWorkers, SupervisedWorkers, WorkerTarget
from pagedserve.ops.chaos.watch import ready_workers
from pagedserve.ops.deploy.endpoints import ops_url, reachable_host
from pagedserve.ops.deploy.local_api import local_config
from pagedserve.ops.deploy.process_group import RestartPolicy
from pagedserve.ops.deploy.supervisor import Supervisor, resolve_model_first
from pagedserve.shared.config import ServeConfig

# The kills are ours and come every few seconds: restart at once, every time. The default policy
# would back off to 10 s and give a worker up after 5 deaths in a minute.
CHAOS_RESTARTS = RestartPolicy(backoff_s=0.25, max_backoff_s=1.0, max_restarts_per_minute=1000)


class DeploymentError(RuntimeError):
    """No deployment to run against (not reachable, no worker found); the message says what to do."""


@dataclass(slots=True)
class Deployment:
    mode: str  # "start", "attach" or "docker"
    front_endpoint: str
    scheduler_ops: str
    block_manager_ops: str
    target: WorkerTarget
    workers: int  # how many workers make it whole
    supervisor: Supervisor | None = None
    details: dict[str, Any] = field(default_factory=dict)
    worker_timeout_s: float = ServeConfig.model_fields["worker_timeout_s"].default
    api_health: str | None = None  # the API server's /health, when the deployment runs one

    def restarts(self) -> dict[str, int]:
        """Restarts so far of every supervised child (empty when we do not supervise it)."""
        if self.supervisor is None:
            return {}
        return {name: self.supervisor.restarts(name) for name in self.supervisor.group.names()}

    def to_json(self) -> dict[str, Any]:
        out = {
            "mode": self.mode,
            "workers": self.workers,
            "front_endpoint": self.front_endpoint,
            "scheduler_ops": self.scheduler_ops,
            "block_manager_ops": self.block_manager_ops,
            **self.details,
        }
        if self.supervisor is not None:
            out["restarts"] = self.restarts()
        return out


def api_health_url(config: ServeConfig) -> str:
    return f"http://{reachable_host(config.api_host)}:{config.api_port}/health"


def wait_for_workers(scheduler_ops: str, count: int, timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        ready = ready_workers(scheduler_ops) or []
        if len(ready) >= count or time.monotonic() >= deadline:
            return ready
        time.sleep(0.2)


@contextlib.contextmanager
def started(
    workers: int,
    model: str,
    threads: int,
    num_blocks: int | None,
    ready_timeout_s: float,
    api: bool = True,
    api_processes: int = 1,
) -> Iterator[Deployment]:
    config = local_config(model, num_threads=threads, num_blocks=num_blocks, api_processes=api_processes)
    try:
        config = resolve_model_first(config)
    except ValueError as e:
        raise DeploymentError(str(e)) from e
    log_dir = Path(tempfile.mkdtemp(prefix="pagedserve-chaos-"))
    supervisor = Supervisor(config, workers=workers, log_dir=log_dir, policy=CHAOS_RESTARTS, api=api)
    supervisor.start()
    try:
        supervisor.wait_ready(timeout_s=ready_timeout_s)
        ready = wait_for_workers(supervisor.scheduler_ops_url, workers, ready_timeout_s)
        if len(ready) < workers:
            raise DeploymentError(f"only {len(ready)} of {workers} workers ready (logs in {log_dir})")
        yield Deployment(
            "start",
            supervisor.front_endpoint,
            supervisor.scheduler_ops_url,
            supervisor.block_manager_ops_url,
            SupervisedWorkers(supervisor),
            workers,
            supervisor,
            {
                "model": config.model,
                "log_dir": str(log_dir),
                "api_processes": config.api_processes if api else 0,
            },
            config.worker_timeout_s,
            # The API server is one more supervised child once `pagedserve up` runs it.
            supervisor.api_health_url if api else None,
        )
    finally:
        supervisor.stop()


@contextlib.contextmanager
def attached(
    front: str | None, scheduler_ops: str | None, block_manager_ops: str | None, docker_project: str | None
) -> Iterator[Deployment]:
    config = ServeConfig()  # PAGEDSERVE_* variables, else the defaults `pagedserve up` also uses
    front = front or config.front_endpoint
    scheduler_ops = (scheduler_ops or ops_url(config, config.scheduler_ops_port)).rstrip("/")
    block_manager_ops = (block_manager_ops or ops_url(config, config.block_manager_ops_port)).rstrip("/")
    ready = ready_workers(scheduler_ops)
    if ready is None:
        raise DeploymentError(
            f"no scheduler answers at {scheduler_ops}/readyz: start one "
            "(`pagedserve up --workers 3`) or use --start N"
        )
    if not ready:
        raise DeploymentError(f"the scheduler at {scheduler_ops} has no ready worker")
    if docker_project is not None:
        target: WorkerTarget = ContainerWorkers(docker_project)
        details = {"compose_project": docker_project}
    else:
        target = ProcessWorkers(front, block_manager_ops_port=urllib.parse.urlsplit(block_manager_ops).port)
        details = {}
    mine = [v for v in target.victims() if v.worker_id in ready]
    if not mine:
        where = f"compose project {docker_project!r}" if docker_project else f"processes serving {front}"
        raise DeploymentError(f"none of the ready workers {ready} is among the {where}")
    yield Deployment(
        "docker" if docker_project else "attach",
        front,
        scheduler_ops,
        block_manager_ops,
        target,
        len(ready),
        None,
        details,
        config.worker_timeout_s,
        api_health_url(config) if "api" in target.services() else None,
    )
