"""The local supervisor's RestartPolicy, applied to Ray actor restarts.

Ray restarts an actor at once and as often as `max_restarts` says, with no backoff and no notion
of a crash loop. So each service actor keeps a small `RestartLedger` in Ray's GCS (it survives the
actor and its node) and, when Ray starts it again, asks `next_start` how long to wait first, or
whether to give up: the same backoff, cap per minute and "stable after" rule as
`process_group.ProcessGroup`, one policy for both ways of running pagedserve.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from pagedserve.ops.deploy.process_group import RestartPolicy

WINDOW_S = 60.0  # the policy's cap counts restarts in any window this long


@dataclass(slots=True)
class RestartLedger:
    started_at: float  # wall clock (time.time()): a restart may land on another node
    consecutive_failures: int = 0
    recent_restarts: list[float] = field(default_factory=list)  # within WINDOW_S of the last start
    total_restarts: int = 0

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> RestartLedger:
        return cls(**json.loads(raw))


@dataclass(frozen=True, slots=True)
class StartPlan:
    delay_s: float | None  # None: give up, the service crash-loops
    ledger: RestartLedger  # to store before starting


def next_start(ledger: RestartLedger | None, now: float, policy: RestartPolicy) -> StartPlan:
    """What a service actor does when it (re)starts at `now`; `ledger` is None on its first start.

    A run that lasted `stable_after_s` starts the backoff over; more than the policy's restarts in
    a minute give up, so a bad flag or a taken port is one clear failure, not a flapping actor."""
    if ledger is None:
        return StartPlan(0.0, RestartLedger(started_at=now))
    ran_s = now - ledger.started_at
    failures = 1 if ran_s >= policy.stable_after_s else ledger.consecutive_failures + 1
    recent = [t for t in ledger.recent_restarts if now - t <= WINDOW_S]
    if len(recent) >= policy.max_restarts_per_minute:
        return StartPlan(None, ledger)
    delay = policy.delay(failures)
    updated = RestartLedger(
        started_at=now + delay,
        consecutive_failures=failures,
        recent_restarts=[*recent, now],
        total_restarts=ledger.total_restarts + 1,
    )
    return StartPlan(delay, updated)
