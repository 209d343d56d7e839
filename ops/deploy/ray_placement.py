"""Where the services of `pagedserve up --ray` run and which addresses they use: decisions only.

Nothing here imports Ray, so the CLI can parse `--ray-worker-resources` on an install without the
extra, and the decisions are tested without a cluster. `ray_deployment.py` asks Ray the questions
(which nodes, which IPs) and acts on the answers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pagedserve.shared.config import ServeConfig

DEFAULT_WORKER_RESOURCES = '{"CPU": 1}'
# Hosts a service binds that a process on another machine cannot connect to as written.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "*", "")


@dataclass(frozen=True, slots=True)
class RayPlacement:
    """What `--ray` and `--ray-worker-resources` asked for."""

    address: str  # host:port of a cluster's GCS, or "auto"
    worker_resources: Mapping[str, float] = field(default_factory=lambda: {"CPU": 1.0})

    @property
    def ray_init_address(self) -> str | None:
        # Ray's own "auto" fails when no cluster runs; ours (None) connects to RAY_ADDRESS or the
        # cluster last started on this machine, and otherwise starts a local one for this run.
        return None if self.address == "auto" else self.address


@dataclass(frozen=True, slots=True)
class ActorResources:
    """A Ray actor's resource request: `num_cpus`, `num_gpus` and the custom ones."""

    num_cpus: float = 0.0
    num_gpus: float = 0.0
    custom: Mapping[str, float] = field(default_factory=dict)


def parse_worker_resources(text: str) -> dict[str, float]:
    """`--ray-worker-resources` as a dict of non-negative amounts; ValueError naming the flag."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--ray-worker-resources must be a JSON object, got {text!r} ({e})") from None
    if not isinstance(value, dict) or not value:
        raise ValueError(
            f'--ray-worker-resources must be a non-empty JSON object like {{"GPU": 1}}, got {text!r}'
        )
    for name, amount in value.items():
        if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
            raise ValueError(f"--ray-worker-resources: {name!r} must be a number >= 0, got {amount!r}")
    return {name: float(amount) for name, amount in value.items()}


def actor_resources(wanted: Mapping[str, float]) -> ActorResources:
    """Ray names CPUs and GPUs as actor options and everything else as custom resources.

    A CPU left out is 0, not Ray's default of 1: a worker that asks only for a GPU or a custom
    resource is placed by that alone."""
    custom = {k: v for k, v in wanted.items() if k not in ("CPU", "GPU")}
    return ActorResources(wanted.get("CPU", 0.0), wanted.get("GPU", 0.0), custom)


def worker_config(config: ServeConfig, wanted: Mapping[str, float]) -> ServeConfig:
    """A worker's config fitted to what Ray gives it: as many torch threads as CPUs reserved, and the
    GPU Ray assigned (Ray sets CUDA_VISIBLE_DEVICES, so it is cuda:0), unless the user chose."""
    update: dict[str, object] = {}
    cpus = wanted.get("CPU", 0.0)
    if config.num_threads is None and cpus >= 1:
        update["num_threads"] = int(cpus)
    if wanted.get("GPU", 0.0) > 0 and "device" not in config.model_fields_set:
        update["device"] = "cuda"
    return config.model_copy(update=update) if update else config


def spans_machines(core_ip: str, node_ips: Sequence[str]) -> bool:
    """Several Ray nodes on one machine share its IP: then loopback reaches every one of them."""
    return any(ip != core_ip for ip in node_ips)


def placed_config(config: ServeConfig, core_ip: str, node_ips: Sequence[str]) -> ServeConfig:
    """`config` with the ZeroMQ endpoints every service and client connects to.

    On one machine they stay as given (loopback by default). When the cluster spans machines, an
    endpoint on a local host moves to the core services' node IP, the address Ray itself uses for
    that node, so workers elsewhere can reach it; an endpoint given with a routable host is kept."""
    if not spans_machines(core_ip, node_ips):
        return config
    names = ("front_endpoint", "worker_endpoint", "block_manager_endpoint")
    return config.model_copy(update={n: routable(getattr(config, n), core_ip) for n in names})


def routable(endpoint: str, host: str) -> str:
    """`tcp://127.0.0.1:5556` -> `tcp://<host>:5556`; an endpoint with a routable host is returned as is."""
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp" or (parts.hostname or "") not in LOCAL_HOSTS:
        return endpoint
    netloc_host = f"[{host}]" if ":" in host else host
    return f"tcp://{netloc_host}:{parts.port}"
