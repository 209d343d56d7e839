"""What `pagedserve chaos` sees of the deployment: faults, how fast it answered them, and a timeline.

A thread polls the scheduler's /readyz about 20 times a second. For each fault it notes when the
deployment was seen to miss it (`noticed`) and when it was whole again (`recovered`):

- a worker fault: noticed when the victim's id leaves the ready list or `pagedserve_workers_lost`
  goes up (a worker restarted from the standby within a poll never leaves the list); recovered once
  it is resumed (pauses), back in /readyz and its pool in the block manager's /blocks. A short pause
  is often never noticed: as it should.
- a scheduler or block-manager kill: noticed when /readyz stops answering or says the block
  manager is down; recovered when /readyz is ready with every worker and /blocks has every pool.
- an API kill: noticed when its /health stops answering, recovered when it answers again.

Twice a second it also samples the timeline: requests in flight, pool usage, ready workers,
restarts of each supervised child.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagedserve.ops.chaos.faults import Fault
from pagedserve.ops.deploy import ops_client

POLL_S = 0.05
SAMPLE_S = 0.5
LOST_METRIC = "pagedserve_workers_lost_total"
# Counters the report sums over the run, across scheduler restarts (each starts them from 0).
KV_METRICS = ("pagedserve_requests_resumed_total", "pagedserve_prefill_recomputed_tokens_total")


# ---------------------------------------------------------------- reading the ops endpoints


def readyz(scheduler_ops: str) -> dict[str, Any] | None:
    """The scheduler's /readyz (503 with no worker, and still a body); None when it does not answer."""
    try:
        _, body = ops_client.get(f"{scheduler_ops}/readyz", timeout_s=1.0)
        return dict(json.loads(body))
    except (OSError, ValueError):
        return None


def answers(url: str) -> bool:
    """Anything HTTP came back (a 503 too): the process is alive and serving."""
    try:
        ops_client.get(url, timeout_s=1.0)
        return True
    except OSError:
        return False


def block_manager_instance(block_manager_ops: str) -> str | None:
    """Which block-manager process answers (a new one after every restart); None if none does."""
    try:
        return str(ops_client.get_json(f"{block_manager_ops}/healthz", timeout_s=1.0).get("instance"))
    except (OSError, ValueError):
        return None


def ready_workers(scheduler_ops: str) -> list[str] | None:
    """The scheduler's live workers; None when it does not answer. /readyz is 503 with no worker,
    and still has the list."""
    try:
        _, body = ops_client.get(f"{scheduler_ops}/readyz", timeout_s=1.0)
        return list(json.loads(body).get("workers", []))
    except (OSError, ValueError):
        return None


def scheduler_requests(scheduler_ops: str) -> dict[str, dict[str, Any]] | None:
    """The scheduler's live requests by id (/requests: status, worker, tokens so far, age); None when
    it does not answer."""
    try:
        view = ops_client.get_json(f"{scheduler_ops}/requests", timeout_s=2.0)
        return {str(r["request_id"]): dict(r) for r in view.get("requests", [])}
    except (OSError, ValueError, KeyError, AttributeError):
        return None


def metric_values(scheduler_ops: str, names: tuple[str, ...]) -> dict[str, float] | None:
    """Unlabelled counters of the scheduler's /metrics (absent ones: 0); None when it does not answer."""
    try:
        _, body = ops_client.get(f"{scheduler_ops}/metrics", timeout_s=1.0)
    except OSError:
        return None
    values = dict.fromkeys(names, 0.0)
    for line in body.decode(errors="replace").splitlines():
        name, _, value = line.partition(" ")
        if name in values:
            values[name] = float(value)
    return values


def workers_lost(scheduler_ops: str) -> float | None:
    values = metric_values(scheduler_ops, (LOST_METRIC,))
    return None if values is None else values[LOST_METRIC]


@dataclass(slots=True)
class RunningTotal:
    """A counter summed over scheduler restarts: a value below the last one is a new process's."""

    last: float = 0.0
    before: float = 0.0  # what earlier scheduler processes counted

    def see(self, value: float) -> None:
        if value < self.last:
            self.before += self.last
        self.last = value

    @property
    def total(self) -> float:
        return self.before + self.last


def blocks(block_manager_ops: str) -> dict[str, Any] | None:
    try:
        return ops_client.get_json(f"{block_manager_ops}/blocks", timeout_s=5.0)
    except (OSError, ValueError):
        return None


def pool_ids(dump: dict[str, Any] | None) -> list[str]:
    return [] if dump is None else [p["worker_id"] for p in dump.get("pools", [])]


# ---------------------------------------------------------------- the watcher


@dataclass(slots=True)
class Sample:
    t: float  # time.monotonic()
    in_flight: int
    ready: int | None  # None: the scheduler did not answer
    blocks_used: int | None
    blocks_total: int | None

    def to_json(self, t0: float) -> list[Any]:
        return [round(self.t - t0, 2), self.in_flight, self.ready, self.blocks_used, self.blocks_total]


@dataclass(slots=True)
class Timeline:
    samples: list[Sample] = field(default_factory=list)
    restarts: list[tuple[float, str]] = field(default_factory=list)  # (when seen, child name)

    def to_json(self, t0: float) -> dict[str, Any]:
        return {
            "columns": ["t_s", "in_flight", "ready_workers", "blocks_used", "blocks_total"],
            "samples": [s.to_json(t0) for s in self.samples],
            "restarts": [[round(t - t0, 2), name] for t, name in self.restarts],
        }


class DeploymentWatch:
    def __init__(
        self,
        scheduler_ops: str,
        block_manager_ops: str,
        workers: int,
        api_health: str | None = None,
        in_flight: Callable[[], int] = lambda: 0,
        restarts: Callable[[], dict[str, int]] | None = None,
        poll_s: float = POLL_S,
        service_pids: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.scheduler_ops = scheduler_ops
        self.block_manager_ops = block_manager_ops
        self.workers = workers  # how many make the deployment whole
        self.api_health = api_health
        self.in_flight = in_flight
        self.restarts = restarts
        self.poll_s = poll_s
        # With several API processes /health stays up through a kill (the others answer): the killed
        # one's pid, replaced by the supervisor, is what shows it was missed and is back.
        self.service_pids = service_pids
        self.faults: list[Fault] = []
        self.errors: list[str] = []  # ticks that failed (reported; the watch goes on)
        self.timeline = Timeline()
        self._ready: list[str] = []
        self._restart_counts: dict[str, int] = {}
        self._next_sample = 0.0
        self._bm_instance: str | None = None
        self.kv_totals = {name: RunningTotal() for name in KV_METRICS}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-watch", daemon=True)

    def start(self) -> DeploymentWatch:
        self._ready = ready_workers(self.scheduler_ops) or []
        self._bm_instance = block_manager_instance(self.block_manager_ops)
        self._restart_counts = dict(self.restarts()) if self.restarts else {}
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def ready(self) -> list[str]:
        with self._lock:
            return list(self._ready)

    def open_faults(self) -> list[Fault]:
        with self._lock:
            return [f for f in self.faults if f.recovered_at is None]

    def record(self, fault: Fault) -> Fault:
        if fault.is_worker:
            fault.lost_before = workers_lost(self.scheduler_ops)
        if fault.kind == "block_manager_kill":
            # Read now: a restart is quick, and the scheduler may resync between two polls of /readyz.
            fault.instance_before = self._bm_instance
        with self._lock:
            self.faults.append(fault)
        return fault

    def wait_recovered(self, timeout_s: float) -> bool:
        """Until every fault so far has been recovered from."""
        deadline = time.monotonic() + timeout_s
        while self.open_faults() and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        return not self.open_faults()

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # a dead watch would stall every fault after it: go on
                self.errors.append(f"{type(exc).__name__}: {exc}")
            next_tick = max(next_tick + self.poll_s, time.monotonic())
            self._stop.wait(next_tick - time.monotonic())

    def _tick(self) -> None:
        now = time.monotonic()
        state = readyz(self.scheduler_ops)
        ready = None if state is None else list(state.get("workers", []))
        if ready is not None:
            with self._lock:
                self._ready = ready
        pending = self.open_faults()
        dump = None
        if now >= self._next_sample or any(f.noticed_at is not None for f in pending):
            dump = blocks(self.block_manager_ops)
        if now >= self._next_sample:
            self._next_sample = now + SAMPLE_S
            self._sample(now, ready, dump)
        lost = None
        if any(f.is_worker and f.noticed_at is None for f in pending):
            lost = workers_lost(self.scheduler_ops)
        bm_pending = any(f.kind == "block_manager_kill" for f in pending)
        if bm_pending or now >= self._next_sample:
            instance = block_manager_instance(self.block_manager_ops)
            if not bm_pending and instance is not None:
                self._bm_instance = instance
        else:
            instance = self._bm_instance
        api_up = pids = None
        if any(f.kind == "api_kill" for f in pending):
            api_up = None if self.api_health is None else answers(self.api_health)
            pids = None if self.service_pids is None else self.service_pids()
        for fault in pending:
            # None: no pid to judge by (an attached deployment's API is judged by /health alone).
            replaced = None if pids is None else pids.get(fault.target) not in (None, fault.pid)
            if fault.noticed_at is None and _noticed(fault, state, ready, lost, api_up, instance, replaced):
                fault.noticed_at = now
            if fault.pending_resume or fault.noticed_at is None and not fault.kind.startswith("worker_pause"):
                continue  # a kill is recovered from only after it was seen; a pause may pass unseen
            if _recovered(
                fault, state, ready, pool_ids(dump) if dump else None, self.workers, api_up, replaced
            ):
                fault.recovered_at = time.monotonic()

    def read_kv_totals(self) -> dict[str, float]:
        values = metric_values(self.scheduler_ops, KV_METRICS)
        for name, value in (values or {}).items():
            self.kv_totals[name].see(value)
        return {name: total.total for name, total in self.kv_totals.items()}

    def _sample(self, now: float, ready: list[str] | None, dump: dict[str, Any] | None) -> None:
        self.read_kv_totals()
        totals = (dump or {}).get("totals", {})
        self.timeline.samples.append(
            Sample(
                now,
                self.in_flight(),
                None if ready is None else len(ready),
                totals.get("used"),
                totals.get("total"),
            )
        )
        if self.restarts is None:
            return
        for name, count in self.restarts().items():
            for _ in range(count - self._restart_counts.get(name, 0)):
                self.timeline.restarts.append((now, name))
            self._restart_counts[name] = count


def _noticed(
    fault: Fault,
    state: dict[str, Any] | None,
    ready: list[str] | None,
    lost: float | None,
    api_up: bool | None,
    bm_instance: str | None,
    api_replaced: bool | None = None,
) -> bool:
    if fault.kind == "api_kill":  # the port down, or the killed process replaced (others may answer)
        return api_up is False or bool(api_replaced)
    if fault.kind == "scheduler_kill":
        return state is None
    if fault.kind == "block_manager_kill":  # gone, replaced, or the scheduler says it is down
        gone = bm_instance is None or bm_instance != fault.instance_before
        return gone or (state is not None and not state.get("block_manager", True))
    if lost is not None and fault.lost_before is not None and lost > fault.lost_before:
        return True
    if ready is None:
        return False
    if fault.worker_id is not None:
        return fault.worker_id not in ready
    return lost is not None and lost > fault.ready_before


def _recovered(
    fault: Fault,
    state: dict[str, Any] | None,
    ready: list[str] | None,
    pools: list[str] | None,
    workers: int,
    api_up: bool | None,
    api_replaced: bool | None = None,
) -> bool:
    if fault.kind == "api_kill":  # the port answers, and not only from another API process
        return bool(api_up) and api_replaced is not False
    if state is None or ready is None or pools is None:
        return False
    if not fault.is_worker:  # every worker ready before the kill is ready again, with its pool
        need = min(fault.ready_before, workers)
        return bool(state.get("ready")) and len(ready) >= need and len(pools) >= need
    # A worker that comes back under a new id (the default host-pid name) is counted instead.
    if fault.stable_id and fault.worker_id is not None:
        return fault.worker_id in ready and fault.worker_id in pools
    return len(ready) >= fault.ready_before and len(pools) >= fault.ready_before
