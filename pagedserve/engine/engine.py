"""One process, the three cores, the same messages the services send over ZeroMQ.

The pipeline is kept honest: with depth d, up to d steps are executed before the oldest result is
handed back to the scheduler, so step N+1 is always built without N's tokens, exactly as with a
remote worker.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.services.scheduler.scheduler import OutputEvent, RequestDone, Scheduler, StepOutcome
from pagedserve.shared.protocol.step import StepResult

WORKER_ID = "worker-0"


class StalledError(RuntimeError):
    """Work is queued but no step can be built and nothing is in flight: a bug, never a hang."""


class Engine:
    def __init__(
        self,
        scheduler: Scheduler,
        block_manager: BlockManager,
        runner,  # services.worker.runner.ModelRunner (duck-typed: execute(Execute) -> StepResult)
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scheduler = scheduler
        self.block_manager = block_manager
        self.runner = runner
        self.clock = clock
        self.results: deque[StepResult] = deque()
        self._idle_rounds = 0
        block_manager.add_pool(WORKER_ID, runner.num_blocks, runner.block_size)
        scheduler.add_worker(WORKER_ID, runner.num_blocks, runner.block_size)

    def step(self) -> list[OutputEvent | RequestDone]:
        """Fill the pipeline window, then deliver the oldest result."""
        sched = self.scheduler
        events: list[OutputEvent | RequestDone] = []
        while sched.can_schedule(WORKER_ID):
            outcome = self._step_once()
            events.extend(outcome.events)
            if outcome.execute is not None:
                self.results.append(self.runner.execute(outcome.execute))
            if not outcome.again:
                break
        if self.results:
            self._idle_rounds = 0
            events.extend(sched.on_step_result(WORKER_ID, self.results.popleft(), self.clock()))
        elif sched.has_unfinished() and not events:
            # One empty round can be honest (a failed allocation corrects the free-block count);
            # several in a row with nothing in flight cannot.
            self._idle_rounds += 1
            if self._idle_rounds < 4:
                return events
            raise StalledError(
                f"{sched.num_waiting} waiting and {sched.num_running} running, but no step could be built"
            )
        return events

    def _step_once(self) -> StepOutcome:
        now = self.clock()
        return self.scheduler.step_once(WORKER_ID, now, lambda ops: self.block_manager.apply(ops, now))

    def flush(self) -> None:
        """Run until nothing is in flight and every freeable block went back (tests check free == total)."""
        while self.results or self.scheduler.has_unfinished():
            self.step()
        for _ in range(2):  # frees queued by the last results go out with the next (empty) plan
            assert self._step_once().execute is None
