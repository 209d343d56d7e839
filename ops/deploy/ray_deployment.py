"""A whole pagedserve deployment on a Ray cluster: block manager, scheduler (and the API) on the
node that runs `pagedserve up --ray`, N workers spread over the nodes that have their resources.

The same surface as `Supervisor` (start, wait_ready, check, stop, the endpoints), so `pagedserve
up` runs either. Each service is a `ServiceActor` (ray_actor.py) that Ray restarts; this driver
only places them, watches (ray_watch.py) and removes them. The actors are owned by this process:
if it dies without stop(), Ray removes them and their services with it.

    with RayDeployment(config, workers=2, placement=RayPlacement(cluster.address)) as dep:
        dep.wait_ready(timeout_s=120)
        dep.status("worker-0")  # {"pid", "service_pid", "node_id", "node_ip", "restarts"}
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import ray
import structlog
from ray._private import state as ray_state
from ray._raylet import Config as RayConfig
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayError
from ray.experimental import internal_kv
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pagedserve.ops.deploy.endpoints import ConfigEndpoints
from pagedserve.ops.deploy.process_group import RestartPolicy
from pagedserve.ops.deploy.ray_actor import LEDGER_NAMESPACE, ServiceActor, ledger_key
from pagedserve.ops.deploy.ray_placement import RayPlacement, actor_resources, placed_config, worker_config
from pagedserve.ops.deploy.ray_watch import ActorRow, ActorWatch
from pagedserve.ops.deploy.supervisor import (
    API,
    BLOCK_MANAGER,
    CORE_SERVICES,
    SCHEDULER,
    DeploymentFailed,
    worker_name,
)
from pagedserve.shared.config import ServeConfig

log = structlog.get_logger("supervisor")

NAMESPACE = "pagedserve"  # the actors' names (block-manager, scheduler, api, worker-<i>) live here


class RayDeployment(ConfigEndpoints):
    def __init__(
        self,
        config: ServeConfig,
        workers: int = 1,
        *,
        placement: RayPlacement,
        log_dir: Path | None = None,
        policy: RestartPolicy | None = None,
        api: bool = False,
        prefix: str = "",
    ) -> None:
        """`prefix` goes before every actor's name: one shard's of `up --ray --schedulers N`."""
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        if api and config.api_processes > 1:
            # One API actor is all this creates: saying so beats serving with fewer than asked for.
            raise ValueError(
                f"api_processes={config.api_processes}: a Ray deployment runs one API actor; "
                "use `pagedserve up` without --ray for several API processes on one port"
            )
        self.config = config  # its endpoints are final once start() knows the nodes
        self.workers = workers
        self.placement = placement
        self.log_dir = log_dir
        self.policy = policy or RestartPolicy()
        self.api = api
        self.prefix = prefix
        self.worker_names = [worker_name(i) for i in range(workers)]
        self.names = [*CORE_SERVICES, *self.worker_names, *([API] if api else [])]
        self.watch = ActorWatch(self.names)  # told the cluster's health checks once connected
        self.ray_address: str | None = None
        self.num_nodes = 0
        self._actors: dict[str, Any] = {}  # name -> ActorHandle
        self._connected = False

    # ------------------------------------------------------------------ endpoints

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> RayDeployment:
        self._connect()
        here = ray.get_runtime_context().get_node_id()
        nodes = [n for n in ray.nodes() if n["Alive"]]
        self.num_nodes = len(nodes)
        core_ip = next(n["NodeManagerAddress"] for n in nodes if n["NodeID"] == here)
        self.config = placed_config(self.config, core_ip, [n["NodeManagerAddress"] for n in nodes])
        # The core services hold no resources Ray would count (the scheduler is mostly waiting on
        # sockets) and stay on this node: their endpoints are this node's, and they fail with it.
        on_this_node = NodeAffinitySchedulingStrategy(node_id=here, soft=False)
        wanted = actor_resources(self.placement.worker_resources)
        worker_cfg = worker_config(self.config, self.placement.worker_resources)
        spread = {
            "num_cpus": wanted.num_cpus,
            "num_gpus": wanted.num_gpus,
            "resources": dict(wanted.custom),
            "scheduling_strategy": "SPREAD",
        }
        for name in self.names:
            if name in self.worker_names:
                self._actors[name] = self._create(name, "worker", name, worker_cfg, spread)
            else:
                core = {"num_cpus": 0, "scheduling_strategy": on_this_node}
                self._actors[name] = self._create(name, name, None, self.config, core)
        return self

    def _connect(self) -> None:
        if ray.is_initialized():  # another shard of this driver connected: it disconnects, last
            self.ray_address = ray.get_runtime_context().gcs_address
            self.watch = ActorWatch(self.names, node_death_s=node_death_s())
            return
        # ray.init puts in its own SIGTERM handler (sys.exit); `pagedserve up`'s must stay, or a
        # SIGTERM would skip the orderly stop.
        main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM) if main else None
        try:
            ray.init(address=self.placement.ray_init_address, namespace=NAMESPACE, log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise DeploymentFailed(f"cannot connect to Ray at {self.placement.address!r}: {e}") from e
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
        self._connected = True
        self.ray_address = ray.get_runtime_context().gcs_address
        self.watch = ActorWatch(self.names, node_death_s=node_death_s())

    def _create(
        self, name: str, service: str, worker_id: str | None, config: ServeConfig, options: dict[str, Any]
    ) -> Any:
        log_dir = None if self.log_dir is None else str(self.log_dir)
        name = self.prefix + name
        try:
            return (
                ray.remote(ServiceActor)
                .options(name=name, namespace=NAMESPACE, max_restarts=-1, max_task_retries=0, **options)
                .remote(name, service, worker_id, config, self.policy, log_dir)
            )
        except ValueError as e:  # the name is taken: another deployment runs on this cluster
            raise DeploymentFailed(
                f"cannot create actor {name!r} in Ray namespace {NAMESPACE!r}: {e} "
                "(is another pagedserve deployment running on this cluster?)"
            ) from e

    def ready_log_hint(self) -> str:
        return self._log_hint()

    def check(self) -> None:
        """Log what Ray did to the actors since the last call; DeploymentFailed if the block manager,
        the scheduler, the API or every worker is dead for good."""
        alive_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        now = time.monotonic()
        for name, actor in self._actors.items():
            row = actor_row(actor)
            if row is None:
                continue
            for event in self.watch.observe(name, row, alive_nodes, now):
                level = "info" if event.name == "child_started" else "warning"
                getattr(log, level)(event.name, **event.fields)
        dead = self.watch.dead()
        failed = [n for n in dead if n not in self.worker_names]
        if not failed and self.workers and len([n for n in dead if n in self.worker_names]) == self.workers:
            failed = [self.worker_names[0]]
        if failed:
            raise DeploymentFailed(f"{', '.join(failed)} died and Ray will not restart it{self._log_hint()}")

    def stop(self, grace_s: float = 10.0) -> dict[str, int | None]:
        """Stop the services (workers first, the block manager last), remove every actor this
        deployment created, and disconnect (which also stops a local Ray that ray.init started)."""
        codes: dict[str, int | None] = dict.fromkeys(self._actors)
        for group in (self.worker_names, [API], [SCHEDULER], [BLOCK_MANAGER]):
            live = {n: self._actors[n] for n in group if n in self._actors and self._is_alive(n)}
            calls = {n: actor.stop.remote(grace_s) for n, actor in live.items()}
            for n, ref in calls.items():
                try:
                    codes[n] = ray.get(ref, timeout=grace_s + 5)
                except (GetTimeoutError, RayError):
                    codes[n] = None
        for name, actor in self._actors.items():
            ray.kill(actor, no_restart=True)
            internal_kv._internal_kv_del(ledger_key(actor._actor_id.hex()), namespace=LEDGER_NAMESPACE)
            log.info("child_removed", child=name)
        self._actors.clear()
        if self._connected:
            ray.shutdown()
            self._connected = False
        return codes

    def __enter__(self) -> RayDeployment:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ queries (tests, chaos)

    def status(self, name: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """The actor's view: pid, service_pid, node_id, node_ip, restarts. Waits while Ray restarts it."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return ray.get(self._actors[name].status.remote(), timeout=timeout_s)
            except ActorUnavailableError:  # restarting: calls fail instead of waiting for it
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _is_alive(self, name: str) -> bool:
        row = actor_row(self._actors[name])
        return row is not None and row.state == "ALIVE"

    def _log_hint(self) -> str:
        if self.log_dir is None:
            return " (the services' output is above, prefixed by Ray)"
        return f" (see {self.log_dir}/<service>.log on the node that ran it)"


def node_death_s() -> float:
    """How long this cluster takes, at most, to declare a silent node dead: its health-check
    settings (the driver receives the cluster's system config when it connects), plus a period."""
    period_s = RayConfig.health_check_period_ms() / 1000
    missed = RayConfig.health_check_failure_threshold() * (
        period_s + RayConfig.health_check_timeout_ms() / 1000
    )
    return missed + period_s + 1.0


def actor_row(actor: Any) -> ActorRow | None:
    """The actor's entry in the GCS actor table. ray.util.state would need the dashboard; this reads
    the table directly (a private module, so the `ray` extra pins its version)."""
    info = ray_state.actors(actor._actor_id.hex())
    if not info:
        return None
    return ActorRow(info["State"], info["NumRestarts"], info["Pid"], info["Address"]["NodeID"])
