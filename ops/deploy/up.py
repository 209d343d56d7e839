"""`pagedserve up`: run a deployment in the foreground until Ctrl-C or SIGTERM: local processes, or
Ray actors with `--ray` (ray_deployment.py, imported only then: Ray is an optional extra)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from pagedserve.ops.deploy.shards import ShardedDeployment
from pagedserve.ops.deploy.supervisor import DeploymentFailed, Launcher, Supervisor, service_argv
from pagedserve.shared.config import ServeConfig

if TYPE_CHECKING:
    from pagedserve.ops.deploy.ray_deployment import RayDeployment
    from pagedserve.ops.deploy.ray_placement import RayPlacement


class _Stop(Exception):
    """Raised in the main thread by SIGINT/SIGTERM, so every wait below ends at once."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def run_up(
    config: ServeConfig,
    workers: int,
    ready_timeout_s: float,
    log_dir: Path | None = None,
    out: TextIO = sys.stdout,
    launcher: Launcher = service_argv,
    api: bool = False,
    ray: RayPlacement | None = None,
    schedulers: int = 1,
) -> int:
    supervisor: Supervisor | RayDeployment | ShardedDeployment
    if schedulers > 1:
        if ray is not None:
            out.write("error: --schedulers with --ray is not supported yet: run the shards locally\n")
            return 2
        supervisor = ShardedDeployment(
            config, schedulers, workers, log_dir=log_dir, launcher=launcher, api=api
        )
    elif ray is None:
        supervisor = Supervisor(config, workers=workers, log_dir=log_dir, launcher=launcher, api=api)
    else:
        from pagedserve.ops.deploy.ray_deployment import RayDeployment

        supervisor = RayDeployment(config, workers, placement=ray, log_dir=log_dir, api=api)
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        supervisor.start()
        _print_endpoints(supervisor, out, log_dir)
        started = time.monotonic()
        supervisor.wait_ready(timeout_s=ready_timeout_s)
        if api:
            out.write(f"OpenAI-compatible API: {supervisor.api_base_url}  (model {_served_name(config)})\n")
        out.write(f"ready in {time.monotonic() - started:.1f} s; Ctrl-C stops everything\n")
        out.flush()
        while True:
            time.sleep(0.5)
            supervisor.check()
    except _Stop as stop:
        out.write(f"{stop}: stopping\n")
    except (DeploymentFailed, TimeoutError) as e:
        out.write(f"error: {e}\n")
        code = 1
    finally:
        # A second Ctrl-C must not cut the shutdown short: stop() is bounded by its grace period.
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        exit_codes = supervisor.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    out.write("stopped: " + ", ".join(f"{n}={c}" for n, c in exit_codes.items()) + "\n")
    return code


def _print_endpoints(
    supervisor: Supervisor | RayDeployment | ShardedDeployment, out: TextIO, log_dir: Path | None
) -> None:
    if isinstance(supervisor, ShardedDeployment):
        _print_shards(supervisor, out, log_dir)
        return
    api = " and the OpenAI API" if supervisor.api else ""
    on_ray = (
        ""
        if isinstance(supervisor, Supervisor)
        else f" on Ray at {supervisor.ray_address} ({supervisor.num_nodes} nodes)"
    )
    lines = [
        f"pagedserve: block manager, scheduler, {supervisor.workers} worker(s){api}{on_ray}",
        f"  front (SDK)         {supervisor.front_endpoint}",
        f"  scheduler ops       {supervisor.scheduler_ops_url}  /healthz /readyz /requests /metrics",
        f"  block manager ops   {supervisor.block_manager_ops_url}  /healthz /blocks /metrics",
    ]
    if supervisor.api:
        lines.append(
            f"  OpenAI API          {supervisor.api_base_url}  /models /completions /chat/completions"
        )
    if log_dir is not None:
        lines.append(f"  logs                {log_dir}/<service>.log")
    out.write("\n".join(lines) + "\n")
    out.flush()


def _print_shards(deployment: ShardedDeployment, out: TextIO, log_dir: Path | None) -> None:
    shards = deployment.shards
    lines = [
        f"pagedserve: a router in front of {len(shards)} shards of {shards[0].workers} worker(s) each",
        f"  front (SDK)         {deployment.front_endpoint}  (the router)",
        f"  router ops          {deployment.scheduler_ops_url}  /healthz /readyz /shards /metrics",
    ]
    lines += [f"  shard {i} scheduler   {s.scheduler_ops_url}" for i, s in enumerate(shards)]
    if deployment.api:
        lines.append(f"  OpenAI API          {deployment.api_base_url}")
    if log_dir is not None:
        lines.append(f"  logs                {log_dir}/router.log, {log_dir}/shard-<i>/<service>.log")
    out.write("\n".join(lines) + "\n")
    out.flush()


def _served_name(config: ServeConfig) -> str:
    return config.served_model_name or Path(config.model).name
