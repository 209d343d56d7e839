"""`pagedserve up --schedulers N`: N shards (each a block manager, a scheduler and its workers, as
supervisor.py runs them) behind one `pagedserve router`, and the API as the router's client.

Shard i's sockets and ops ports are the deployment's own moved up by (i + 1) x SHARD_PORT_STEP, so the
router takes the deployment's front endpoint and clients connect where they always did. Every shard
runs the same model and LoRA modules; LoRA adapters loaded at run time (through the API, which asks the
router's ops endpoint) are loaded on every shard. With `--ray` each shard is a RayDeployment (its
actors named `shard-<i>-...`), and the router and the API run beside this driver, as local processes.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pagedserve.ops.deploy.endpoints import ConfigEndpoints, ops_url
from pagedserve.ops.deploy.process_group import ChildSpec, ProcessGroup
from pagedserve.ops.deploy.supervisor import (
    API,
    DeploymentFailed,
    Launcher,
    Supervisor,
    api_name,
    config_env,
    service_argv,
)
from pagedserve.shared.config import ServeConfig

if TYPE_CHECKING:
    from pagedserve.ops.deploy.ray_deployment import RayDeployment
    from pagedserve.ops.deploy.ray_placement import RayPlacement

SHARD_PORT_STEP = 100
ROUTER = "router"


def _moved(endpoint: str, by: int) -> str:
    head, port = endpoint.rsplit(":", 1)
    if not port.isdigit():
        raise ValueError(f"{endpoint!r}: shards need endpoints with a port (tcp://host:port)")
    return f"{head}:{int(port) + by}"


def shard_config(config: ServeConfig, index: int) -> ServeConfig:
    by = (index + 1) * SHARD_PORT_STEP
    return config.model_copy(
        update={
            "front_endpoint": _moved(config.front_endpoint, by),
            "worker_endpoint": _moved(config.worker_endpoint, by),
            "block_manager_endpoint": _moved(config.block_manager_endpoint, by),
            "scheduler_ops_port": config.scheduler_ops_port and config.scheduler_ops_port + by,
            "block_manager_ops_port": config.block_manager_ops_port and config.block_manager_ops_port + by,
        }
    )


class ShardedDeployment(ConfigEndpoints):
    def __init__(
        self,
        config: ServeConfig,
        schedulers: int,
        workers: int = 1,
        *,
        log_dir: Path | None = None,
        launcher: Launcher = service_argv,
        api: bool = False,
        ray: RayPlacement | None = None,
    ) -> None:
        if schedulers < 1:
            raise ValueError(f"schedulers must be >= 1, got {schedulers}")
        if config.router_ops_port == 0:
            raise ValueError("router_ops_port is 0 (ops HTTP off): the shards' readiness cannot be observed")
        # Every worker of every shard shares this machine's memory (on Ray, each its node's).
        if ray is None and "workers_per_machine" not in config.model_fields_set:
            config = config.model_copy(update={"workers_per_machine": max(1, schedulers * workers)})
        self.shards: list[Supervisor | RayDeployment] = []
        for i in range(schedulers):
            shard_logs = None if log_dir is None else log_dir / f"shard-{i}"
            if ray is None:
                self.shards.append(
                    Supervisor(shard_config(config, i), workers, log_dir=shard_logs, launcher=launcher)
                )
            else:
                from pagedserve.ops.deploy.ray_deployment import RayDeployment

                self.shards.append(
                    RayDeployment(
                        shard_config(config, i),
                        workers,
                        placement=ray,
                        log_dir=shard_logs,
                        prefix=f"shard-{i}-",
                    )
                )
        self.config = config
        self.workers = workers * schedulers
        self.api = api
        self.log_dir = log_dir
        self.launcher = launcher
        self.group: ProcessGroup | None = None

    def _front_group(self) -> ProcessGroup:
        """The router and the API, told the shards' endpoints as they are once the shards started (a
        Ray shard's move to its node's address when the cluster spans machines)."""
        self.config = self.config.model_copy(
            update={
                "router_shards": [s.config.front_endpoint for s in self.shards],
                "router_shard_ops": [s.scheduler_ops_url for s in self.shards],
            }
        )
        specs = [ChildSpec(ROUTER, self.launcher(ROUTER, None), config_env(self.config))]
        if self.api:
            # The API is the router's client, and asks the router's ops endpoint what it would ask a
            # scheduler's: readiness (a shard answers) and LoRA admin (made on every shard).
            api_config = self.config.model_copy(update={"scheduler_ops_port": self.config.router_ops_port})
            specs += [
                ChildSpec(api_name(i), self.launcher(API, None), config_env(api_config))
                for i in range(self.config.api_processes)
            ]
        return ProcessGroup(specs, log_dir=self.log_dir)

    @property
    def scheduler_ops_url(self) -> str:
        """The router's: /readyz there says a shard answers (each shard's own is checked first)."""
        return ops_url(self.config, self.config.router_ops_port)

    @property
    def block_manager_ops_url(self) -> str:
        return self.shards[0].block_manager_ops_url

    def start(self) -> ShardedDeployment:
        for shard in self.shards:
            shard.start()
        self.group = self._front_group()
        self.group.start()
        return self

    def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 0.2) -> None:
        deadline = time.monotonic() + timeout_s
        for shard in self.shards:
            shard.wait_ready(max(0.0, deadline - time.monotonic()), poll_s)
        super().wait_ready(max(0.0, deadline - time.monotonic()), poll_s)

    def check(self) -> None:
        for shard in self.shards:
            shard.check()
        given_up = self.group.given_up() if self.group is not None else []
        dead = [n for n in given_up if n in (ROUTER, API) or n.startswith(f"{API}-")]
        if dead:
            path = self.group.log_path(dead[0]) if self.group is not None else None
            raise DeploymentFailed(
                f"{dead[0]} exited and was not restarted" + (f" (see {path})" if path else "")
            )

    def stop(self, grace_s: float = 10.0) -> dict[str, int | None]:
        codes = self.group.stop(grace_s) if self.group is not None else {}
        # The last shard first: on Ray the first one holds the driver's connection.
        for i, shard in reversed(list(enumerate(self.shards))):
            codes |= {f"shard-{i}/{name}": code for name, code in shard.stop(grace_s).items()}
        return codes

    def __enter__(self) -> ShardedDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self, service: str, sig: int = signal.SIGKILL) -> int:
        """Signal the router or an API process by name, or 'shard-<i>/<service>' in a local shard."""
        shard, _, name = service.partition("/")
        if name:
            return self._local(shard).kill(name, sig)
        assert self.group is not None, "not started"
        return self.group.send_signal(service, sig)

    def restarts(self, service: str) -> int:
        shard, _, name = service.partition("/")
        if name:
            return self._local(shard).restarts(name)
        assert self.group is not None, "not started"
        return self.group.restarts(service)

    def _local(self, name: str) -> Supervisor:
        shard = self.shards[int(name.removeprefix("shard-"))]
        if not isinstance(shard, Supervisor):
            raise ValueError(f"{name} runs on Ray: signal its actors through Ray")
        return shard
