"""What the live view and `pagedserve top` show of the scheduler: requests, workers, faults, history.

The loop feeds it (a heartbeat, a step, a loss: O(1) each, and one history sample per second);
the ops thread reads it. Workers are remembered after they are lost, with their restarts (a
new incarnation under the same name) and losses: a worker that keeps dying must stay visible
while it is gone, which the liveness table, holding only the living, cannot show.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.scheduler.liveness import STEP_UNANSWERED, WorkerLiveness
from pagedserve.services.scheduler.request import Status
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.shared.ops_history import History

MAX_REQUEST_ROWS = 500  # the page lists this many; the counts above the list are exact
STEP_TIMES_KEPT = 64


@dataclass(slots=True)
class WorkerRecord:
    incarnation: str = ""
    restarts: int = 0  # incarnations after the first
    losses: int = 0
    last_loss: str = ""
    lost_at: float | None = None  # None while it is in the liveness table again
    steps: int = 0
    tokens: int = 0
    step_s: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_TIMES_KEPT))


class SchedulerWatch:
    def __init__(self) -> None:
        self.workers: dict[str, WorkerRecord] = {}
        self.history = History(("waiting", "running", "step_ms", "tokens_per_s"))
        self.tokens = 0
        self.step_timeouts = 0
        self.lora_adapters_last_step = 0  # adapters in the latest step that had any LoRA slots
        self.lora_worker_loads = 0  # adapters workers read from disk inside a step
        self.lora_worker_load_s = 0.0
        self._since_sample: list[float] = []
        self._tokens_at_sample = 0

    # ------------------------------------------------------------ fed by the loop

    def heard(self, worker_id: str, incarnation: str) -> bool:
        """Note a sign of life; True when it comes from a new incarnation (a restart)."""
        record = self.workers.setdefault(worker_id, WorkerRecord(incarnation))
        record.lost_at = None
        if record.incarnation == incarnation:
            return False
        record.incarnation = incarnation
        record.restarts += 1
        return True

    def lost(self, worker_id: str, reason: str, now: float) -> bool:
        """Remember the loss; True when it was a step timeout."""
        record = self.workers.setdefault(worker_id, WorkerRecord())
        record.losses += 1
        record.last_loss = reason
        record.lost_at = now
        timed_out = reason.startswith(STEP_UNANSWERED)
        self.step_timeouts += timed_out
        return timed_out

    def step(self, worker_id: str, step_s: float, num_tokens: int) -> None:
        record = self.workers.setdefault(worker_id, WorkerRecord())
        record.steps += 1
        record.tokens += num_tokens
        record.step_s.append(step_s)
        self.tokens += num_tokens
        self._since_sample.append(step_s)

    def lora_step(self, adapters: int, load_s: float | None) -> None:
        """A step of a worker with LoRA slots: its distinct adapters, and the read time if it loaded one."""
        self.lora_adapters_last_step = adapters
        if load_s is not None:
            self.lora_worker_loads += 1
            self.lora_worker_load_s += load_s

    def sample(self, now: float, waiting: int, running: int) -> None:
        steps, self._since_sample = self._since_sample, []
        step_ms = 1e3 * sum(steps) / len(steps) if steps else 0.0
        rows = self.history.view(now)["t"]
        elapsed = -rows[-1] if rows else self.history.interval_s
        rate = (self.tokens - self._tokens_at_sample) / max(elapsed, 1e-3)
        self._tokens_at_sample = self.tokens
        self.history.add(now, waiting, running, round(step_ms, 2), round(rate, 1))

    # ------------------------------------------------------------ read by the ops thread

    def view(
        self, now: float, core: Scheduler, liveness: WorkerLiveness, faults: dict[str, float]
    ) -> dict[str, Any]:
        links = dict(liveness.links)  # copies: the loop changes these while we read
        workers = []
        for wid, record in sorted(dict(self.workers).items()):
            link = links.get(wid)
            steps = list(record.step_s)
            if link is None:
                state = "lost"
            elif link.active:
                state = "active"
            else:
                state = "joining" if not link.routable else "paused"
            workers.append(
                {
                    "worker_id": wid,
                    "state": state,
                    "last_heartbeat_age_s": None if link is None else round(now - link.last_heartbeat, 3),
                    "lost_for_s": None if record.lost_at is None else round(now - record.lost_at, 1),
                    "restarts": record.restarts,
                    "losses": record.losses,
                    "last_loss": record.last_loss,
                    "steps": record.steps,
                    "tokens": record.tokens,
                    "step_ms_last": round(1e3 * steps[-1], 2) if steps else None,
                    "step_ms_mean": round(1e3 * sum(steps) / len(steps), 2) if steps else None,
                    "step_ms_max": round(1e3 * max(steps), 2) if steps else None,
                    "num_blocks": None if link is None else link.num_blocks,
                    "runtime": {} if link is None else dict(link.runtime),
                }
            )
        block_size = {wid: link.block_size for wid, link in links.items()}
        live = [r for r in core.live_requests() if r.status is not Status.FINISHED]
        live.sort(key=lambda r: (r.status is not Status.RUNNING, r.arrival))
        requests = []
        for r in live[:MAX_REQUEST_ROWS]:
            bs = block_size.get(r.worker_id) or 0
            requests.append(
                {
                    "request_id": r.request_id,
                    "status": r.status.value,
                    "worker_id": r.worker_id,
                    "priority": r.sampling.priority,
                    "prompt_tokens": len(r.prompt_token_ids),
                    "output_tokens": len(r.output_token_ids),
                    "max_tokens": r.sampling.max_tokens,
                    "blocks": -(-r.num_slots_given // bs) if bs and r.status is Status.RUNNING else 0,
                    "cached_tokens": r.num_cached_tokens,
                    "spec_proposed": r.num_proposed,
                    "spec_accepted": r.num_accepted,
                    "lora": None if r.lora is None else r.lora.name,
                    "age_s": round(now - r.arrival, 2),
                }
            )
        history = self.history.view(now)
        rates = history["tokens_per_s"]
        stats = core.stats
        return {
            "waiting": core.num_waiting,
            "running": core.num_running,
            "listed": len(requests),
            "requests": requests,
            "workers": workers,
            "tokens_per_s": rates[-1] if rates else 0.0,
            "faults": faults | {"step_timeouts": self.step_timeouts},
            "speculation": {
                "enabled": core.speculation.enabled,
                "proposed": stats.spec_proposed,
                "accepted": stats.spec_accepted,
                "acceptance": round(stats.spec_acceptance, 4),
                "row_cost": round(core.speculation.row_cost, 4),  # the config's, or learned (row_cost.py)
            },
            "lora": {
                "enabled": core.limits.max_loras > 0,
                "adapters": core.loras.names(),
                "adapters_last_step": self.lora_adapters_last_step,
                "worker_loads": self.lora_worker_loads,
                "worker_load_s": round(self.lora_worker_load_s, 3),
            },
            "history": history,
        }
