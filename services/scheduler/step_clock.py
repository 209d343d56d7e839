"""How long a worker's steps take, and so how long one may go unanswered before it is lost.

A step's time here is what the scheduler sees: from sending it to its result (so with a pipeline
it includes the wait behind the step before it), the same clock the timeout is judged by. The
timeout is max(floor, factor x p99 of the last `window` steps), capped; until `min_samples`
steps are seen it is the cap (a cold worker's first steps may compile, page in weights...).
A step past max(floor / 2, dump_factor x p99) is a suspected hang: the service dumps stacks then,
while the worker is still stuck and before the timeout moves its requests.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

# The p99 is computed again only once this many steps came in since (statistics.quantiles over a
# 256-step window costs ~20 us, ~5% of what one step's result costs the scheduler at one request); a
# window's p99 moves little in 8 steps, and the timeout's floor covers the first steps of a slower phase.
REFRESH_EVERY = 8


@dataclass(slots=True)
class _Samples:
    times: deque[float]
    p99: float | None = None  # cached; None until first asked for
    since: int = 0  # steps observed since p99 was computed


@dataclass(slots=True)
class StepClock:
    floor_s: float
    factor: float
    cap_s: float
    dump_factor: float = 10.0
    window: int = 256
    min_samples: int = 16
    _workers: dict[str, _Samples] = field(default_factory=dict)

    def observe(self, worker_id: str, seconds: float) -> None:
        samples = self._workers.get(worker_id)
        if samples is None:
            samples = self._workers[worker_id] = _Samples(deque(maxlen=self.window))
        samples.times.append(seconds)
        samples.since += 1

    def forget(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)

    def p99(self, worker_id: str) -> float | None:
        """The p99 of the recent steps, or None while there are fewer than `min_samples`."""
        samples = self._workers.get(worker_id)
        if samples is None or len(samples.times) < self.min_samples:
            return None
        if samples.p99 is None or samples.since >= REFRESH_EVERY:
            samples.p99 = statistics.quantiles(samples.times, n=100, method="inclusive")[98]
            samples.since = 0
        return samples.p99

    def describe(self, worker_id: str) -> dict[str, float | None]:
        """For the log line of a timeout or a suspected hang."""
        p99 = self.p99(worker_id)
        return {
            "p99_step_s": None if p99 is None else round(p99, 4),
            "timeout_s": round(self.timeout_s(worker_id), 3),
            "dump_after_s": round(self.dump_after_s(worker_id), 3),
        }

    def timeout_s(self, worker_id: str) -> float:
        p99 = self.p99(worker_id)
        if p99 is None:
            return self.cap_s
        return min(self.cap_s, max(self.floor_s, self.factor * p99))

    def dump_after_s(self, worker_id: str) -> float:
        """A step unanswered this long is a suspected hang (never later than the timeout)."""
        p99 = self.p99(worker_id)
        if p99 is None:
            return self.cap_s
        return min(self.timeout_s(worker_id), max(self.floor_s / 2, self.dump_factor * p99))
