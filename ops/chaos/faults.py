"""The faults `pagedserve chaos` injects, and the loop that injects them at random over the run.

    worker_kill          SIGKILL a worker: its requests recompute elsewhere, it is restarted
    worker_pause_short   SIGSTOP a worker for less than the worker timeout, then SIGCONT: only latency
    worker_pause_long    SIGSTOP it for several worker timeouts: declared lost, requests move, and on
                         SIGCONT it must be fenced (nothing it sent before believed), reset, rejoin
    scheduler_kill       SIGKILL the scheduler: clients reconnect and re-submit by request id
    block_manager_kill   SIGKILL the block manager: the scheduler recomputes every request once it is back
    api_kill             SIGKILL the API server (a deployment that runs one): it is restarted

One fault every `every_s`, its kind drawn from shuffled rounds of the allowed kinds (random order,
yet every kind comes up once per round, so even a short run hits each one; a kind that cannot be
injected now stays in the round and the slot goes to the next kind of the round that can). A kind whose service the deployment does not run
(no API server) is left out and reported as unavailable. A worker
fault needs a second ready worker (the last one is never hit: requests would wait, not move) and a
victim not already hit, and no scheduler or block manager still recovering; those two are hit only
while neither is recovering and no worker is paused (the API server only while it is not itself
recovering: it holds no request state, so its restart blocks nothing), so each recovery time measures one
fault, not a pile-up (a worker still restarting from a kill may overlap: recovery then means the
workers ready before the kill are ready again). Each refused attempt is counted as skipped.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from pagedserve.ops.chaos.targets import Victim, WorkerTarget

WORKER_FAULTS = ("worker_kill", "worker_pause_short", "worker_pause_long")
SERVICE_FAULTS = {"scheduler_kill": "scheduler", "block_manager_kill": "block-manager", "api_kill": "api"}
FAULT_KINDS = (*WORKER_FAULTS, *SERVICE_FAULTS)
# The API server carries no request state of its own (a restart is a reconnect for its clients), so
# its recovery blocks nothing; these two do: every request depends on them.
CORE_KILLS = ("scheduler_kill", "block_manager_kill")
MIN_READY_TO_HIT = 2

# Pause lengths as multiples of the worker timeout: short ones must pass unnoticed, long ones must
# be noticed (the heartbeat thread stops with the process) and fenced when the worker wakes up.
SHORT_PAUSE = (0.2, 0.6)
LONG_PAUSE = (2.0, 5.0)


@dataclass(slots=True)
class Fault:
    kind: str
    target: str  # worker-1, scheduler, block-manager, api, a container name
    worker_id: str | None  # for worker faults: its id in /readyz and /blocks
    stable_id: bool
    pid: int | None
    at: float  # time.monotonic() of the signal
    ready_before: int
    pause_s: float | None = None
    resumed_at: float | None = None  # SIGCONT sent (pauses)
    instance_before: str | None = None  # block-manager kills: the instance that was hit
    # Worker faults: the scheduler's workers-lost count at the fault. A worker restarted (a standby
    # promoted) faster than /readyz is polled never leaves the ready list: the count says it was seen.
    lost_before: float | None = None
    noticed_at: float | None = None  # the deployment was seen to miss it
    recovered_at: float | None = None  # whole again: see DeploymentWatch

    @property
    def is_worker(self) -> bool:
        return self.kind in WORKER_FAULTS

    @property
    def pending_resume(self) -> bool:
        return self.pause_s is not None and self.resumed_at is None

    def to_json(self, t0: float) -> dict[str, Any]:
        def since(x: float | None, origin: float) -> float | None:
            return None if x is None else round(x - origin, 3)

        return {
            "kind": self.kind,
            "target": self.target,
            "worker_id": self.worker_id,
            "pid": self.pid,
            "at_s": since(self.at, t0),
            "pause_s": None if self.pause_s is None else round(self.pause_s, 3),
            "noticed_after_s": since(self.noticed_at, self.at),
            "recovered_after_s": since(self.recovered_at, self.at),
        }


class FaultInjector:
    """Draws and injects faults; resumes paused processes on time. Runs on its own thread."""

    def __init__(
        self,
        target: WorkerTarget,
        watch: Any,  # DeploymentWatch: ready(), open_faults(), record()
        kinds: list[str],
        every_s: float,
        worker_timeout_s: float,
        rng: random.Random,
        log: Any,  # log(text): one line per fault
    ) -> None:
        unknown = sorted(set(kinds) - set(FAULT_KINDS))
        if unknown:
            raise ValueError(f"fault kinds must be among {', '.join(FAULT_KINDS)}; got {unknown}")
        self.target = target
        self.watch = watch
        self.kinds = kinds
        self.every_s = every_s
        self.worker_timeout_s = worker_timeout_s
        self.rng = rng
        self.log = log
        self.skipped: dict[str, int] = {}
        self._round: list[str] = []
        self.unavailable: list[str] = []
        self._paused: list[tuple[Fault, Victim]] = []
        self._lock = threading.Lock()

    def run(self, t0: float, until: float) -> None:
        running = self.target.services()
        self.unavailable = [k for k in self.kinds if k in SERVICE_FAULTS and SERVICE_FAULTS[k] not in running]
        self.kinds = [k for k in self.kinds if k not in self.unavailable]
        for kind in self.unavailable:
            self.log(f"no {kind}: the deployment runs no {SERVICE_FAULTS[kind]}")
        if not self.kinds:
            return
        next_fault = t0 + self.every_s
        try:
            while True:
                now = time.monotonic()
                self._resume_due(now)
                if next_fault >= until:
                    if not self._paused:
                        return
                    next_fault = float("inf")
                elif now >= next_fault:
                    next_fault += self.every_s
                    self._inject_one(t0)
                wake = min([next_fault, *(f.at + (f.pause_s or 0.0) for f, _ in self._paused)])
                time.sleep(min(max(wake - time.monotonic(), 0.0), 0.5))
        finally:
            self.resume_all()

    def resume_all(self) -> None:
        """Never leave a process stopped (a crash of ours, the end of the run)."""
        self._resume_due(float("inf"))

    # ------------------------------------------------------------------ internals

    def _inject_one(self, t0: float) -> None:
        """One slot: the round's next kind, or, when it cannot be injected now, the first of the
        round's other kinds that can (the refused ones stay in the round, so the mix stays even)."""
        if not self._round:
            self._round = self.rng.sample(self.kinds, len(self.kinds))
        for kind in reversed(list(self._round)):
            why = self._inject_worker(kind) if kind in WORKER_FAULTS else self._inject_service(kind)
            if why is None:
                self._round.remove(kind)
                break
            self.skipped[kind] = self.skipped.get(kind, 0) + 1
            self.log(f"{time.monotonic() - t0:6.1f} s  no {kind}: {why}")
        else:
            return  # nothing can be injected now: the whole round waits for the next slot
        fault = self.watch.faults[-1]
        extra = f" for {fault.pause_s:.2f} s" if fault.pause_s is not None else ""
        self.log(f"{fault.at - t0:6.1f} s  {kind} {fault.target} (pid {fault.pid}){extra}")

    def _inject_worker(self, kind: str) -> str | None:
        ready = self.watch.ready()
        busy = {f.target for f in self.watch.open_faults()}
        if any(f.kind in CORE_KILLS for f in self.watch.open_faults()):
            return "the scheduler or block manager is still recovering"
        choices = [v for v in self.target.victims() if v.worker_id in ready and v.name not in busy]
        if len(ready) < MIN_READY_TO_HIT or not choices:
            return f"{len(ready)} ready worker(s), {len(choices)} free to hit"
        victim = self.rng.choice(choices)
        pause_s = None
        if kind != "worker_kill":
            lo, hi = SHORT_PAUSE if kind == "worker_pause_short" else LONG_PAUSE
            pause_s = self.rng.uniform(lo, hi) * self.worker_timeout_s
        at = time.monotonic()
        try:
            self.target.signal(victim, signal.SIGKILL if pause_s is None else signal.SIGSTOP)
        except (ProcessLookupError, OSError) as e:  # it died on its own meanwhile
            return f"could not signal {victim.name}: {e}"
        fault = Fault(
            kind, victim.name, victim.worker_id, victim.stable_id, victim.pid, at, len(ready), pause_s
        )
        self.watch.record(fault)
        if pause_s is not None:
            with self._lock:
                self._paused.append((fault, victim))
        return None

    def _inject_service(self, kind: str) -> str | None:
        name = SERVICE_FAULTS[kind]
        open_faults = self.watch.open_faults()
        if any(f.target == name for f in open_faults):
            return f"the {name} is still recovering"
        if kind in CORE_KILLS and any(f.kind in CORE_KILLS or f.pause_s is not None for f in open_faults):
            return "a core service is recovering or a worker is paused"
        pid = self.target.services().get(name)
        if pid is None:
            return f"no {name} in this deployment"
        at = time.monotonic()
        try:
            pid = self.target.signal_service(name, signal.SIGKILL)
        except (ProcessLookupError, OSError) as e:
            return f"could not signal {name}: {e}"
        self.watch.record(Fault(kind, name, None, True, pid, at, len(self.watch.ready())))
        return None

    def _resume_due(self, now: float) -> None:
        with self._lock:
            due = [(f, v) for f, v in self._paused if f.at + (f.pause_s or 0.0) <= now]
            self._paused = [p for p in self._paused if p not in due]
        for fault, victim in due:
            # Killed meanwhile (the supervisor restarts it): nothing left to wake.
            with contextlib.suppress(ProcessLookupError, OSError):
                self.target.signal(victim, signal.SIGCONT)
            fault.resumed_at = time.monotonic()
