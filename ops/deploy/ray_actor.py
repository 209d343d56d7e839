"""One pagedserve service as a Ray actor: the actor owns the service's process and lives exactly as
long as it does.

The service is the usual `python -m pagedserve.ops.cli <service>`, started by a one-child
`ProcessGroup` that does not restart it: when the service exits, the actor exits too, and Ray
restarts the actor (`max_restarts`), wherever its resources are; when the actor dies (SIGKILL, its
node lost), the service dies with it (the group's parent-death signal). Ray places and restarts;
the services still talk ZeroMQ to each other, never through Ray.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import ray
import structlog
from ray.experimental import internal_kv

from pagedserve.ops.deploy.process_group import ChildSpec, ProcessGroup, RestartPolicy, exit_cause
from pagedserve.ops.deploy.ray_restarts import RestartLedger, next_start
from pagedserve.ops.deploy.supervisor import config_env, service_argv
from pagedserve.shared.config import ServeConfig

log = structlog.get_logger("ray-actor")

LEDGER_NAMESPACE = "pagedserve-restarts"


class ServiceGaveUp(RuntimeError):
    """Raised by the actor's constructor: Ray then marks the actor dead and restarts it no more."""


def ledger_key(actor_id: str) -> str:
    # The actor id stays the same across Ray's restarts of that actor and is new for every deployment.
    return f"ledger/{actor_id}"


class ServiceActor:
    def __init__(
        self,
        name: str,
        service: str,
        worker_id: str | None,
        config: ServeConfig,
        policy: RestartPolicy,
        log_dir: str | None = None,
    ) -> None:
        self.name = name
        self._key = ledger_key(ray.get_runtime_context().get_actor_id())
        raw = internal_kv._internal_kv_get(self._key, namespace=LEDGER_NAMESPACE)
        plan = next_start(None if raw is None else RestartLedger.from_json(raw), time.time(), policy)
        if plan.delay_s is None:
            raise ServiceGaveUp(
                f"{name} restarted {policy.max_restarts_per_minute} times within a minute: not again"
            )
        internal_kv._internal_kv_put(self._key, plan.ledger.to_json(), namespace=LEDGER_NAMESPACE)
        self.restarts = plan.ledger.total_restarts
        time.sleep(plan.delay_s)
        # Ray's environment for this actor (CUDA_VISIBLE_DEVICES of its GPU, the node's PATH) plus the
        # deployment's config variables: the child reads exactly the config the driver was given.
        env = config_env(config, base=os.environ)
        spec = ChildSpec(name, service_argv(service, worker_id), env, restart=False)
        self.group = ProcessGroup([spec], log_dir=None if log_dir is None else Path(log_dir))
        self.group.start()
        self._stopping = threading.Event()
        threading.Thread(target=self._exit_with_service, name="service-watch", daemon=True).start()

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": os.getpid(),
            "service_pid": self.group.pid(self.name),
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "restarts": self.restarts,
        }

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the service (SIGKILL after `grace_s`); its exit code. The driver then ray.kills us."""
        self._stopping.set()
        return self.group.stop(grace_s)[self.name]

    def _exit_with_service(self) -> None:
        while not self._stopping.wait(0.1):
            if self.group.given_up():  # the service exited (the group never restarts it)
                break
        if self._stopping.is_set():
            return
        code = self.group.stop(0.0)[self.name]
        log.warning(
            "service_exited",
            child=self.name,
            exit_code=code,
            cause=exit_cause(code or 0),
            then="this actor exits and Ray restarts it",
        )
        # An unexpected exit of the actor's process: Ray counts it as a failure and restarts the actor.
        os._exit(1)
