"""The processes `pagedserve chaos` may hit, found one of three ways, each able to signal one.

- `SupervisedWorkers`: the children of a `Supervisor` this command started (`--start N`): its
  workers, and its scheduler, block manager and API server (when the deployment runs one).
- `ProcessWorkers`: processes of a running `pagedserve up`, found by command line in /proc
  (workers and scheduler by their front endpoint, the block manager by its ops port); its
  supervisor restarts them.
- `ContainerWorkers`: worker containers of a compose project, through the Docker SDK; their
  restart policy brings them back. Only workers: the core containers are not looked for.

A signal is SIGKILL (a crash) or SIGSTOP, later SIGCONT (a hang that comes back).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pagedserve.ops.deploy.process_group import deliver
from pagedserve.ops.deploy.supervisor import Supervisor, worker_name
from pagedserve.shared.config import ServeConfig


@dataclass(frozen=True, slots=True)
class Victim:
    name: str
    worker_id: str | None
    stable_id: bool  # restarted under the same id
    pid: int | None = None
    handle: Any = None  # what kill() needs: a worker index, a container


class WorkerTarget(Protocol):
    def victims(self) -> list[Victim]: ...

    def signal(self, victim: Victim, sig: int) -> None: ...

    def services(self) -> dict[str, int]:
        """The core services that can be hit, by name ("scheduler", "block-manager", "api"): pid."""
        ...

    def signal_service(self, name: str, sig: int) -> int:
        """Signal one core service; returns the pid hit."""
        ...


# What a core service is called as a child of `Supervisor` and on the `pagedserve` command line.
SERVICE_NAMES = ("scheduler", "block-manager", "api")


# ---------------------------------------------------------------- --start N


class SupervisedWorkers:
    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def victims(self) -> list[Victim]:
        found = []
        for i in range(self.supervisor.workers):
            name = worker_name(i)
            pid = self.supervisor.pid(name)
            if pid is not None:  # the Supervisor passes --worker-id worker-<i>: the id survives restarts
                found.append(Victim(name, name, True, pid, i))
        return found

    def signal(self, victim: Victim, sig: int) -> None:
        self.supervisor.kill_worker(victim.handle, sig)

    def services(self) -> dict[str, int]:
        names = [n for n in self.supervisor.group.names() if n in SERVICE_NAMES]
        return {n: pid for n in names if (pid := self.supervisor.pid(n)) is not None}

    def signal_service(self, name: str, sig: int) -> int:
        return self.supervisor.kill(name, sig)


# ---------------------------------------------------------------- a running `pagedserve up`


def service_command(argv: list[str]) -> str | None:
    """The service a `python -m pagedserve.ops.cli <service>` or `.../pagedserve <service>` command
    line runs, or `python -m pagedserve.services.api`; None for anything else (`pagedserve chaos`)."""
    for i, arg in enumerate(argv[:-1]):
        module = arg == "pagedserve.ops.cli" and i > 0 and argv[i - 1] == "-m"
        if module or os.path.basename(arg) == "pagedserve":
            return argv[i + 1] if argv[i + 1] in ("worker", *SERVICE_NAMES) else None
        if arg == "-m" and argv[i + 1] == "pagedserve.services.api":
            return "api"
    return None


def is_worker_command(argv: list[str]) -> bool:
    """`python -m pagedserve.ops.cli worker ...` or `.../pagedserve worker ...` (not `pagedserve chaos`)."""
    return service_command(argv) == "worker"


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def setting(argv: list[str], environ: dict[str, str], field: str) -> str | None:
    """A config field as that process resolved it: its flag, else its PAGEDSERVE_* variable."""
    return flag_value(argv, "--" + field.replace("_", "-")) or environ.get(f"PAGEDSERVE_{field.upper()}")


def _read_process(pid_dir: Path) -> tuple[list[str], dict[str, str]] | None:
    try:
        argv = [a.decode(errors="replace") for a in (pid_dir / "cmdline").read_bytes().split(b"\0") if a]
        raw = (pid_dir / "environ").read_bytes().split(b"\0")
    except OSError:  # gone meanwhile, or not ours to read
        return None
    environ = dict(e.decode(errors="replace").split("=", 1) for e in raw if b"=" in e)
    return argv, environ


def _same_endpoint(a: str, b: str) -> bool:
    return a.replace("localhost", "127.0.0.1") == b.replace("localhost", "127.0.0.1")


class ProcessWorkers:
    """Worker processes on this machine that belong to the deployment at `front_endpoint`.

    Other deployments may run here too (tests, colleagues): a worker counts only when its front
    endpoint (flag, PAGEDSERVE_FRONT_ENDPOINT, or the default) is ours, which holds for every child
    of `pagedserve up`. The scheduler's ready list is checked as well, by the caller."""

    def __init__(
        self, front_endpoint: str, proc: Path = Path("/proc"), block_manager_ops_port: int | None = None
    ) -> None:
        self.front_endpoint = front_endpoint
        self.proc = proc
        self.block_manager_ops_port = block_manager_ops_port
        self.default_front = ServeConfig.model_fields["front_endpoint"].default
        self.default_bm_ops = ServeConfig.model_fields["block_manager_ops_port"].default

    def victims(self) -> list[Victim]:
        return [v for kind, v in self._scan() if kind == "worker"]

    def services(self) -> dict[str, int]:
        return {kind: v.pid for kind, v in self._scan() if kind != "worker" and v.pid is not None}

    def _ours(self, kind: str, argv: list[str], environ: dict[str, str]) -> bool:
        if kind == "block-manager":  # it knows no front endpoint: matched by the ops port we read
            port = setting(argv, environ, "block_manager_ops_port") or self.default_bm_ops
            return self.block_manager_ops_port is not None and int(port) == self.block_manager_ops_port
        front = setting(argv, environ, "front_endpoint") or self.default_front
        return _same_endpoint(front, self.front_endpoint)

    def _scan(self) -> Iterator[tuple[str, Victim]]:
        for pid_dir in self.proc.iterdir():
            if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
                continue
            found = _read_process(pid_dir)
            kind = None if found is None else service_command(found[0])
            if found is None or kind is None or not self._ours(kind, *found):
                continue
            argv, environ = found
            pid = int(pid_dir.name)
            if kind != "worker":
                yield kind, Victim(kind, None, True, pid)
                continue
            worker_id = setting(argv, environ, "worker_id")
            if worker_id is not None:
                yield kind, Victim(worker_id, worker_id, True, pid)
            else:  # the service's default name, which a restarted process does not keep
                yield kind, Victim(f"pid {pid}", f"{socket.gethostname()}-{pid}", False, pid)

    def signal(self, victim: Victim, sig: int) -> None:
        assert victim.pid is not None
        deliver(victim.pid, sig)

    def signal_service(self, name: str, sig: int) -> int:
        pid = self.services().get(name)
        if pid is None:
            raise ProcessLookupError(f"no {name} process of this deployment")
        deliver(pid, sig)
        return pid


# ---------------------------------------------------------------- docker compose


class ContainerWorkers:
    """Running worker containers (compose services named worker*) of one compose project.

    The kill is a SIGKILL to the container's init process from this machine, not `docker kill`:
    the engine marks a container it killed on request as stopped by hand and its restart policy
    then leaves it down, whereas a crash is what the policy exists for."""

    def __init__(self, project: str, client: Any = None) -> None:
        import docker  # the Docker SDK for Python; only this mode needs it

        self.project = project
        self.client = client or docker.from_env()

    def victims(self) -> list[Victim]:
        found = []
        label = f"com.docker.compose.project={self.project}"
        for c in self.client.containers.list(filters={"label": label, "status": "running"}):
            if not c.labels.get("com.docker.compose.service", "").startswith("worker"):
                continue
            # The worker names itself <hostname>-<container id[:12]> (ops/deploy/worker_identity.py),
            # and keeps that name across restarts of the same container.
            hostname = c.attrs["Config"]["Hostname"][:40]
            pid = c.attrs["State"]["Pid"] or None
            found.append(Victim(c.name, f"{hostname}-{c.id[:12]}", True, pid, c))
        return found

    def signal(self, victim: Victim, sig: int) -> None:
        assert victim.pid is not None, f"{victim.name} has no process"
        deliver(victim.pid, sig)

    def services(self) -> dict[str, int]:
        return {}  # the core containers are not looked for: workers only

    def signal_service(self, name: str, sig: int) -> int:
        raise ProcessLookupError(f"{name}: only worker containers are hit in --docker mode")
