"""A whole pagedserve deployment as local processes: block manager, scheduler, N workers.

Each service runs as `python -m pagedserve.ops.cli <service>` with the deployment's config in `PAGEDSERVE_*`
variables, so a child reads exactly the config the supervisor was given. Workers are named
`worker-0..N-1`. Used by `pagedserve up` / `demo` and by the integration and chaos tests:

    with Supervisor(config, workers=2, log_dir=tmp) as sv:
        sv.wait_ready(timeout_s=120)
        sv.kill_worker(0)  # it is restarted with backoff
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from pagedserve.ops.deploy.endpoints import ConfigEndpoints
from pagedserve.ops.deploy.kv_segments import SegmentFolder
from pagedserve.ops.deploy.process_group import ChildSpec, ProcessGroup, RestartPolicy
from pagedserve.services.checkpoint import BUNDLED_NAME
from pagedserve.shared.config import ServeConfig

BLOCK_MANAGER = "block-manager"
SCHEDULER = "scheduler"
API = "api"
STANDBY = "worker-standby"
API_STANDBY = "api-standby"
CORE_SERVICES = (BLOCK_MANAGER, SCHEDULER)

# Given a service name and a worker id (None for the core services), the argv that runs it.
Launcher = Callable[[str, str | None], Sequence[str]]


def service_argv(service: str, worker_id: str | None) -> list[str]:
    argv = [sys.executable, "-m", "pagedserve.ops.cli", service]
    return argv + ["--worker-id", worker_id] if worker_id is not None else argv


def config_env(config: ServeConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: our environment) with every config variable set from `config`.

    Inherited config variables are dropped first: the config already absorbed them, and a stale
    one must not override a value the caller set in Python. Other PAGEDSERVE_* variables (the
    model cache folder) pass through."""
    fields = {f"PAGEDSERVE_{name.upper()}" for name in ServeConfig.model_fields}
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in fields}
    for name, value in config.model_dump(exclude={"worker_id"}).items():
        if value is not None:
            # A section (speculative_config) or a list (lora_modules) travels as JSON.
            text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
            env[f"PAGEDSERVE_{name.upper()}"] = text
    # Children log to files or our terminal; Python must not buffer a crash's last lines.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def worker_name(index: int) -> str:
    return f"worker-{index}"


def api_name(index: int) -> str:
    """The API processes: `api` (the one chaos and the start log know), then `api-1`, `api-2`..."""
    return API if index == 0 else f"{API}-{index}"


def resolve_model_first(config: ServeConfig) -> ServeConfig:
    """`config` with its model checked and prepared once here, before the children start.

    ValueError names a model that does not exist or cannot be read. A path becomes absolute (the
    children may run elsewhere); the bundled name stays a name. A GGUF model's tokenizer is derived and
    cached now, so the scheduler, the API and the workers all find it instead of each deriving it."""
    from pagedserve.services.checkpoint import load_checkpoint, resolve_model  # lazily: transformers

    path = resolve_model(config.model)
    checkpoint = load_checkpoint(config.model, config.tokenizer)
    if checkpoint.tokenizer_path is not None and checkpoint.tokenizer_path.suffix == ".gguf":
        from pagedserve.services.gguf_tokenizer import cache_tokenizer

        cache_tokenizer(checkpoint.tokenizer_path)
    if config.model == BUNDLED_NAME:
        return config
    return config.model_copy(update={"model": str(path.resolve())})


def _armed(spec: ChildSpec, failpoints: str, rearm: bool) -> ChildSpec:
    armed = ["--failpoints", failpoints]
    return ChildSpec(
        spec.name,
        [*spec.argv, *armed],
        spec.env,
        spec.restart,
        restart_argv=None if rearm else spec.argv,
        standby_args=None if spec.standby_args is None else [*spec.standby_args, *(armed if rearm else [])],
        standby=spec.standby,
    )


class DeploymentFailed(RuntimeError):
    """A core service died more often than the restart policy allows."""


class Supervisor(ConfigEndpoints):
    def __init__(
        self,
        config: ServeConfig,
        workers: int = 1,
        *,
        log_dir: Path | None = None,
        policy: RestartPolicy | None = None,
        launcher: Launcher = service_argv,
        restart_core: bool = True,
        api: bool = False,
        failpoints: Mapping[str, str] | None = None,
        rearm_failpoints: bool = True,
    ) -> None:
        """`failpoints`: child name -> spec, armed in that child (test deployments); with
        `rearm_failpoints` false only its first process gets them, not its restarts."""
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        # Every worker here shares this machine's memory: an auto-sized KV pool takes 1/N of the share.
        if workers and "workers_per_machine" not in config.model_fields_set:
            config = config.model_copy(update={"workers_per_machine": workers})
        # Our own workers (a custom launcher may not run ours): their pools in segments we own
        # (kv_segments.py), and a standby loaded ahead to take a dead worker's place.
        real = launcher is service_argv and workers > 0 and config.simulate_step_ms is None
        self.segments: SegmentFolder | None = None
        if real and config.kv_persist and config.kv_segment_dir is None and config.device == "cpu":
            self.segments = SegmentFolder()
            config = config.model_copy(update={"kv_segment_dir": str(self.segments.path)})
        self.config = config
        self.workers = workers
        self.api = api
        env = config_env(config)
        specs = [ChildSpec(s, launcher(s, None), env, restart=restart_core) for s in CORE_SERVICES]
        specs += [
            ChildSpec(
                worker_name(i),
                launcher("worker", worker_name(i)),
                env,
                standby_args=["--worker-id", worker_name(i)],
                standby=STANDBY,
            )
            for i in range(workers)
        ]
        if api:  # the OpenAI-compatible API: one more client of the front socket, restarted like the rest
            # With api_processes > 1: api, api-1, ... on one port (SO_REUSEPORT), each supervised.
            specs += [
                ChildSpec(
                    api_name(i), launcher(API, None), env, restart_core, standby_args=[], standby=API_STANDBY
                )
                for i in range(config.api_processes)
            ]
        # Test deployments: named faults armed in one child each (shared/failpoints.py).
        unknown = sorted(set(failpoints or {}) - {s.name for s in specs})
        if unknown:
            raise ValueError(f"failpoints for unknown children {unknown}")
        specs = [
            _armed(s, failpoints[s.name], rearm_failpoints) if failpoints and s.name in failpoints else s
            for s in specs
        ]
        standbys = []
        if real and config.standby_workers:
            standbys.append(ChildSpec(STANDBY, [*service_argv("worker", None), "--standby"], env))
        # The API's own: a killed API process is replaced by one already built (services/api/standby.py).
        if api and launcher is service_argv and restart_core and config.standby_api:
            standbys.append(ChildSpec(API_STANDBY, [*service_argv(API, None), "--standby"], env))
        self.group = ProcessGroup(specs, policy=policy, log_dir=log_dir, standby=standbys)

    # ------------------------------------------------------------------ endpoints

    def endpoints(self) -> dict[str, str]:
        found = {
            "front": self.front_endpoint,
            "scheduler_ops": self.scheduler_ops_url,
            "block_manager_ops": self.block_manager_ops_url,
        }
        return found | ({"api": self.api_base_url} if self.api else {})

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Supervisor:
        self.group.start()
        return self

    def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 0.2) -> None:
        """Block until the scheduler's /readyz says 200 (a worker has registered).

        Raises DeploymentFailed as soon as a core service is down for good, TimeoutError after
        `timeout_s`; both name the log to read."""
        if self.config.scheduler_ops_port == 0:
            raise ValueError("scheduler_ops_port is 0 (ops HTTP off): readiness cannot be observed")
        super().wait_ready(timeout_s, poll_s)

    def ready_log_hint(self) -> str:
        return self._log_hint(SCHEDULER)

    def check(self) -> None:
        """Raise DeploymentFailed if the block manager, the scheduler or every worker is down for good."""
        given_up = self.group.given_up()
        dead = [n for n in given_up if n in CORE_SERVICES or n == API or n.startswith(f"{API}-")]
        if not dead and self.workers and sum(n.startswith("worker-") for n in given_up) == self.workers:
            dead = [worker_name(0)]
        if dead:
            raise DeploymentFailed(f"{', '.join(dead)} exited and was not restarted{self._log_hint(dead[0])}")

    def stop(self, grace_s: float = 10.0) -> dict[str, int | None]:
        codes = self.group.stop(grace_s)
        if self.segments is not None:
            self.segments.remove()  # every worker is gone: nobody maps them any more
        return codes

    def __enter__(self) -> Supervisor:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ chaos

    def kill_worker(self, index: int, sig: int = signal.SIGKILL) -> int:
        """Signal worker `index`; the supervisor restarts it with backoff. Returns the pid hit."""
        if not 0 <= index < self.workers:
            raise IndexError(f"worker index {index} outside 0..{self.workers - 1}")
        return self.group.send_signal(worker_name(index), sig)

    def kill(self, service: str, sig: int = signal.SIGKILL) -> int:
        """Signal any child by name: 'block-manager', 'scheduler' or 'worker-<i>'."""
        return self.group.send_signal(service, sig)

    def pid(self, service: str) -> int | None:
        return self.group.pid(service)

    def restarts(self, service: str) -> int:
        return self.group.restarts(service)

    def _log_hint(self, service: str) -> str:
        path = self.group.log_path(service)
        return "" if path is None else f" (see {path})"
