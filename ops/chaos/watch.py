"""What `pagedserve chaos` sees of the deployment: kills and how fast the deployment answered them.

A thread polls the scheduler's /readyz about 20 times a second. For each kill it notes when the
scheduler noticed (the victim's id left the ready list, or, for a victim of unknown id,
`pagedserve_workers_lost` went up) and when the deployment was whole again (the restarted worker
is back in /readyz and its pool in the block manager's /blocks).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from pagedserve.ops.chaos.targets import Victim
from pagedserve.ops.deploy import ops_http

POLL_S = 0.05
LOST_METRIC = "pagedserve_workers_lost_total"


@dataclass(slots=True)
class Kill:
    victim: str  # what was hit: worker-1, a container name, a pid
    worker_id: str | None  # its id in /readyz and /blocks, when known
    stable_id: bool  # the restarted worker comes back under the same id
    pid: int | None
    killed_at: float  # time.monotonic()
    ready_before: int  # workers in /readyz just before the kill
    lost_before: float  # pagedserve_workers_lost just before the kill
    detected_at: float | None = None
    whole_at: float | None = None

    def detected_after_s(self) -> float | None:
        return None if self.detected_at is None else self.detected_at - self.killed_at

    def whole_after_s(self) -> float | None:
        return None if self.whole_at is None else self.whole_at - self.killed_at

    def to_json(self, t0: float) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 3)

        return {
            "victim": self.victim,
            "worker_id": self.worker_id,
            "pid": self.pid,
            "at_s": r(self.killed_at - t0),
            "detected_after_s": r(self.detected_after_s()),
            "whole_after_s": r(self.whole_after_s()),
        }


# ---------------------------------------------------------------- reading the ops endpoints


def ready_workers(scheduler_ops: str) -> list[str] | None:
    """The scheduler's live workers; None when it does not answer. /readyz is 503 with no worker,
    and still has the list."""
    try:
        _, body = ops_http.get(f"{scheduler_ops}/readyz", timeout_s=1.0)
        return list(json.loads(body).get("workers", []))
    except (OSError, ValueError):
        return None


def workers_lost(scheduler_ops: str) -> float | None:
    try:
        _, body = ops_http.get(f"{scheduler_ops}/metrics", timeout_s=1.0)
    except OSError:
        return None
    for line in body.decode(errors="replace").splitlines():
        if line.startswith(LOST_METRIC + " "):
            return float(line.split()[1])
    return None


def blocks(block_manager_ops: str) -> dict[str, Any] | None:
    try:
        return ops_http.get_json(f"{block_manager_ops}/blocks", timeout_s=5.0)
    except (OSError, ValueError):
        return None


def pool_ids(dump: dict[str, Any] | None) -> list[str]:
    return [] if dump is None else [p["worker_id"] for p in dump.get("pools", [])]


# ---------------------------------------------------------------- the watcher


class DeploymentWatch:
    def __init__(self, scheduler_ops: str, block_manager_ops: str, poll_s: float = POLL_S) -> None:
        self.scheduler_ops = scheduler_ops
        self.block_manager_ops = block_manager_ops
        self.poll_s = poll_s
        self.kills: list[Kill] = []
        self._ready: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-watch", daemon=True)

    def start(self) -> DeploymentWatch:
        self._ready = ready_workers(self.scheduler_ops) or []
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def ready(self) -> list[str]:
        with self._lock:
            return list(self._ready)

    def open_kills(self) -> list[Kill]:
        with self._lock:
            return [k for k in self.kills if k.whole_at is None]

    def record(self, victim: Victim, killed_at: float, ready_before: int, lost_before: float) -> Kill:
        kill = Kill(
            victim.name, victim.worker_id, victim.stable_id, victim.pid, killed_at, ready_before, lost_before
        )
        with self._lock:
            self.kills.append(kill)
        return kill

    def wait_whole(self, timeout_s: float) -> bool:
        """Until every kill so far has been answered (detected, and the deployment whole again)."""
        deadline = time.monotonic() + timeout_s
        while self.open_kills() and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        return not self.open_kills()

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            self._tick()
            next_tick = max(next_tick + self.poll_s, time.monotonic())
            self._stop.wait(next_tick - time.monotonic())

    def _tick(self) -> None:
        ready = ready_workers(self.scheduler_ops)
        if ready is None:
            return  # the scheduler did not answer this time: nothing can be concluded
        now = time.monotonic()
        with self._lock:
            self._ready = ready
        pending = self.open_kills()
        lost = None
        if any(k.detected_at is None and k.worker_id is None for k in pending):
            lost = workers_lost(self.scheduler_ops)
        for kill in pending:
            if kill.detected_at is None and _noticed(kill, ready, lost):
                kill.detected_at = now
        back = [k for k in pending if k.detected_at is not None and _back(k, ready)]
        if back:
            pools = pool_ids(blocks(self.block_manager_ops))
            for kill in back:
                if _pool_back(kill, pools):
                    kill.whole_at = time.monotonic()


def _noticed(kill: Kill, ready: list[str], lost: float | None) -> bool:
    if kill.worker_id is not None:
        return kill.worker_id not in ready
    return lost is not None and lost > kill.lost_before


def _back(kill: Kill, ready: list[str]) -> bool:
    # A worker that comes back under a new id (the default host-pid name) is counted instead.
    if kill.stable_id and kill.worker_id is not None:
        return kill.worker_id in ready
    return len(ready) >= kill.ready_before


def _pool_back(kill: Kill, pools: list[str]) -> bool:
    if kill.stable_id and kill.worker_id is not None:
        return kill.worker_id in pools
    return len(pools) >= kill.ready_before
