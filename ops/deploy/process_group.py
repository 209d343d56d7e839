"""A group of child processes kept alive: restarted with backoff when they die, stopped as one.

Knows nothing about pagedserve: a child is a name, an argv and an environment. `Supervisor`
builds the specs; tests drive this with tiny `python -c` children.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import structlog

from pagedserve.shared.parent_death import die_with_parent

log = structlog.get_logger("supervisor")

# sysexits.h EX_CONFIG: a child that refuses its configuration (a KV pool too small for max_model_len)
# would refuse it again on every restart; it is given up at once, its message in its log.
EXIT_CONFIG = 78


@dataclass(frozen=True, slots=True)
class ChildSpec:
    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None  # None: inherit ours
    restart: bool = True
    restart_argv: Sequence[str] | None = None  # for restarts, when not `argv` (faults armed once only)
    # A standby of the group may take this child's place on a restart, told these arguments
    # (services/worker/standby.py, services/api/standby.py): the one named `standby`, or the only one.
    standby_args: Sequence[str] | None = None
    standby: str | None = None


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """Exponential backoff between restarts, and a cap on restarts in any 60 s window.

    The cap turns a crash loop (bad flag, port taken) into one clear failure instead of a child
    that flaps forever."""

    backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    max_restarts_per_minute: int = 5
    stable_after_s: float = 30.0  # a child that ran this long starts its backoff over

    def delay(self, consecutive_failures: int) -> float:
        return min(self.backoff_s * 2 ** max(consecutive_failures - 1, 0), self.max_backoff_s)


@dataclass(slots=True)
class _Child:
    spec: ChildSpec
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None  # set while waiting out a backoff
    consecutive_failures: int = 0
    restarts: collections.deque[float] = field(default_factory=collections.deque)
    total_restarts: int = 0
    given_up: bool = False
    log_file: IO[bytes] | None = None


class ProcessGroup:
    def __init__(
        self,
        specs: Sequence[ChildSpec],
        policy: RestartPolicy | None = None,
        log_dir: Path | None = None,
        poll_interval_s: float = 0.05,
        standby: ChildSpec | Sequence[ChildSpec] | None = None,
    ) -> None:
        """`standby`: processes kept started ahead (their stdin a pipe), each to replace a child that
        has `standby_args` (and names it, when there are several) when it dies: told those arguments
        on one JSON line, it becomes that child, and another standby of its kind is started."""
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"child names must be unique, got {names}")
        self.policy = policy or RestartPolicy()
        self.log_dir = log_dir
        self.poll_interval_s = poll_interval_s
        self._children = {s.name: _Child(s) for s in specs}
        standbys = [] if standby is None else [standby] if isinstance(standby, ChildSpec) else list(standby)
        self._standbys = {s.name: _Child(s) for s in standbys}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self._spawn_error: OSError | None = None
        self._grace_s = 10.0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Spawn every child. Children are spawned and stopped by the watcher thread only: the
        kernel's parent-death signal is tied to the spawning thread, so it must outlive them."""
        if self._watcher is not None:
            raise RuntimeError("process group already started")
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        spawned = threading.Event()
        self._watcher = threading.Thread(
            target=self._watch, args=(spawned,), name="process-group", daemon=True
        )
        self._watcher.start()
        spawned.wait()
        if self._spawn_error is not None:
            self.stop()
            raise self._spawn_error

    def stop(self, grace_s: float = 10.0) -> dict[str, int | None]:
        """SIGTERM every child (last started first), wait up to `grace_s`, SIGKILL the rest.

        Returns each child's exit code. Safe to call twice and before start()."""
        self._grace_s = grace_s
        self._stopping.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
        with self._lock:
            return {n: None if c.proc is None else c.proc.returncode for n, c in self._children.items()}

    # ------------------------------------------------------------------ queries and chaos

    def names(self) -> list[str]:
        """Every child's name, in start order."""
        return list(self._children)

    def pid(self, name: str) -> int | None:
        with self._lock:
            proc = self._children[name].proc
            return proc.pid if proc is not None and proc.poll() is None else None

    def restarts(self, name: str) -> int:
        with self._lock:
            return self._children[name].total_restarts

    def alive(self, name: str) -> bool:
        return self.pid(name) is not None

    def given_up(self) -> list[str]:
        """Children that died more often than the restart policy allows (or may not restart)."""
        with self._lock:
            return [n for n, c in self._children.items() if c.given_up]

    def log_path(self, name: str) -> Path | None:
        return None if self.log_dir is None else self.log_dir / f"{name}.log"

    def send_signal(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Signal one child (chaos): the watcher sees it die and restarts it. Returns the pid hit."""
        with self._lock:
            proc = self._children[name].proc
            if proc is None or proc.poll() is not None:
                raise ProcessLookupError(f"child {name!r} is not running")
            _signal(proc, sig)
            return proc.pid

    # ------------------------------------------------------------------ internals

    def standby_pid(self, name: str | None = None) -> int | None:
        """The pid of the standby `name` (default: the only or first one) while it waits alive."""
        with self._lock:
            standby = self._standbys.get(name) if name else next(iter(self._standbys.values()), None)
            proc = None if standby is None else standby.proc
            return proc.pid if proc is not None and proc.poll() is None else None

    def _spawn(self, child: _Child, argv: Sequence[str] | None = None) -> None:
        stdout: IO[bytes] | None = None
        if self.log_dir is not None:
            if child.log_file is None:
                child.log_file = open(self.log_dir / f"{child.spec.name}.log", "ab")  # noqa: SIM115 - closed in stop()
            stdout = child.log_file
        env = None if child.spec.env is None else dict(child.spec.env)
        child.proc = subprocess.Popen(
            list(argv or child.spec.argv),
            env=env,
            stdin=subprocess.PIPE if child.spec.name in self._standbys else subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout is not None else None,
            # Own session: a Ctrl-C in the terminal reaches only us, and we stop children in order.
            start_new_session=True,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
        child.started_at = time.monotonic()
        child.restart_at = None
        log.info("child_started", child=child.spec.name, pid=child.proc.pid)

    def _watch(self, spawned: threading.Event) -> None:
        try:
            with self._lock:
                for child in self._children.values():
                    self._spawn(child)
                for standby in self._standbys.values():
                    self._spawn(standby)
        except OSError as e:
            self._spawn_error = e
        spawned.set()
        while not self._stopping.wait(self.poll_interval_s):
            with self._lock:
                now = time.monotonic()
                for child in self._children.values():
                    self._tend(child, now)
        self._terminate_all()

    def _terminate_all(self) -> None:
        with self._lock:
            everyone = [*self._children.values(), *self._standbys.values()]
            live = [c for c in reversed(everyone) if c.proc is not None and c.proc.poll() is None]
            for child in live:
                _signal(child.proc, signal.SIGTERM)
            deadline = time.monotonic() + self._grace_s
            for child in live:
                assert child.proc is not None
                try:
                    child.proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
                except subprocess.TimeoutExpired:
                    log.warning(
                        "child_killed", child=child.spec.name, pid=child.proc.pid, grace_s=self._grace_s
                    )
                    _signal(child.proc, signal.SIGKILL)
                    child.proc.wait()
            for child in everyone:
                if child.log_file is not None:
                    child.log_file.close()
                    child.log_file = None
                if child.proc is not None and child.proc.stdin is not None:
                    child.proc.stdin.close()

    def _tend(self, child: _Child, now: float) -> None:
        if child.given_up:
            return
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.restarts.append(now)
                child.total_restarts += 1
                try:
                    if not self._promote_standby(child, now):
                        self._spawn(child, child.spec.restart_argv)
                except OSError as e:
                    child.given_up = True
                    log.error("child_restart_failed", child=child.spec.name, error=str(e))
            return
        if child.proc is None or (code := child.proc.poll()) is None:
            return
        ran_s = now - child.started_at
        child.consecutive_failures = (
            1 if ran_s >= self.policy.stable_after_s else child.consecutive_failures + 1
        )
        while child.restarts and now - child.restarts[0] > 60.0:
            child.restarts.popleft()
        if (
            not child.spec.restart
            or code == EXIT_CONFIG
            or len(child.restarts) >= self.policy.max_restarts_per_minute
        ):
            child.given_up = True
            log.error(
                "child_given_up",
                child=child.spec.name,
                exit_code=code,
                cause=exit_cause(code),
                restarts_last_minute=len(child.restarts),
            )
            return
        delay = self.policy.delay(child.consecutive_failures)
        child.restart_at = now + delay
        log.warning(
            "child_exited",
            child=child.spec.name,
            exit_code=code,
            cause=exit_cause(code),
            ran_s=round(ran_s, 2),
            restart_in_s=delay,
            restart_number=child.total_restarts + 1,
        )

    def _promote_standby(self, child: _Child, now: float) -> bool:
        """Hand `child`'s place to the standby, if there is a live one and the child takes it."""
        if child.spec.standby_args is None or not self._standbys:
            return False
        name = child.spec.standby or next(iter(self._standbys))
        standby = self._standbys.get(name)
        if standby is None:  # its kind of standby is not kept
            return False
        if standby.proc is None or standby.proc.poll() is not None or standby.proc.stdin is None:
            self._spawn(standby)  # died meanwhile: the next restart may find it ready
            return False
        log_path = None if self.log_dir is None else str(self.log_dir / f"{child.spec.name}.log")
        order = json.dumps({"args": list(child.spec.standby_args), "log": log_path}) + "\n"
        try:
            standby.proc.stdin.write(order.encode())
            standby.proc.stdin.close()
        except OSError:  # it died this instant
            self._spawn(standby)
            return False
        child.proc, standby.proc = standby.proc, None
        child.started_at = now
        child.restart_at = None
        log.info("child_promoted_from_standby", child=child.spec.name, pid=child.proc.pid)
        self._spawn(standby)
        return True


def exit_cause(code: int) -> str:
    """What ended a child, in words: 'SIGKILL' for -9, 'exit 1', ..."""
    if code == EXIT_CONFIG:
        return f"exit {code} (configuration refused)"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


def deliver(pid: int, sig: int) -> None:
    """`kill(pid, sig)`, with a SIGCONT first for anything but a pause, a resume or a SIGKILL: a
    stopped process keeps a SIGTERM pending, unhandled, for as long as it stays stopped (a worker
    paused by chaos, or by its own `stop` failpoint, outlived its supervisor that way)."""
    if sig not in (signal.SIGSTOP, signal.SIGCONT, signal.SIGKILL):
        os.kill(pid, signal.SIGCONT)
    os.kill(pid, sig)


def _signal(proc: subprocess.Popen[bytes] | None, sig: int) -> None:
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            deliver(proc.pid, sig)
