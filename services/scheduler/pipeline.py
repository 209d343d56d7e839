"""The pipeline window: at most `depth` steps in flight per worker, answered in order."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class InFlightStep:
    step: int
    request_ids: list[str]
    sent_at: float
    # Each request's slots once this step is done (parallel to request_ids): committed on its result.
    slots_after: list[int] = field(default_factory=list)
    # Requests whose blocks this step copies or forks: lost with the step, they cannot resume.
    unsafe: frozenset[str] = frozenset()
    lookahead: dict[str, int] = field(default_factory=dict)  # proposal slots granted, by request
    decode_rows: int = 0  # a step of decodes only: how many (their proposals come with the result); else 0


@dataclass(slots=True)
class PipelineWindow:
    """Steps sent to one worker and not yet answered. A worker runs steps in order, so results
    arrive in order; anything else means the worker (or the wire) is broken."""

    depth: int
    steps: deque[InFlightStep] = field(default_factory=deque)
    next_step: int = 0

    def has_room(self) -> bool:
        return len(self.steps) < self.depth

    def __len__(self) -> int:
        return len(self.steps)

    def open(
        self,
        request_ids: list[str],
        now: float,
        slots_after: list[int] | None = None,
        unsafe: frozenset[str] = frozenset(),
        lookahead: dict[str, int] | None = None,
        decode_rows: int = 0,
    ) -> int:
        step = self.next_step
        self.next_step += 1
        self.steps.append(
            InFlightStep(step, request_ids, now, slots_after or [], unsafe, lookahead or {}, decode_rows)
        )
        return step

    def close(self, step: int) -> InFlightStep:
        if not self.steps or self.steps[0].step != step:
            expected = self.steps[0].step if self.steps else None
            raise ValueError(f"result for step {step} out of order: expected step {expected}")
        return self.steps.popleft()

    def oldest_sent_at(self) -> float | None:
        return self.steps[0].sent_at if self.steps else None
