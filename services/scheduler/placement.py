"""Placement across workers: which worker a request waits for, and each worker's scheduling state.

A request waits on the least-loaded worker (running + waiting). With no worker live it waits as an
orphan, and is placed when one registers. Each worker has its own waiting queue, running list,
pipeline window and a mirror of its pool's free blocks (from every batch reply).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedserve.services.scheduler.pipeline import PipelineWindow
from pagedserve.services.scheduler.request import Request
from pagedserve.services.scheduler.waiting import WaitingQueue

if TYPE_CHECKING:
    from pagedserve.services.scheduler.planning import StepPlan


@dataclass(slots=True)
class WorkerState:
    worker_id: str
    num_blocks: int
    block_size: int
    window: PipelineWindow
    waiting: WaitingQueue
    running: list[Request] = field(default_factory=list)
    free_blocks: int = 0
    to_free: list[Request] = field(default_factory=list)  # freeable: no step in flight names them
    forget: list[str] = field(default_factory=list)  # the worker may drop these
    stray: list[str] = field(default_factory=list)  # tables forked for a step that then could not run
    starving: bool = False  # a running request could not grow: admit nobody until it can
    # A step planned whose block-manager answer is still out (the service sends the batch and goes on
    # reading its sockets): the worker gets no other plan until `commit` takes this one.
    planned: StepPlan | None = None
    # Lost with its pool in shared memory: its running requests wait for it (resumption.py).
    suspended_at: float | None = None
    pool_epoch: str = ""  # of the pool they wait for
    incarnation: str = ""  # of the process that was lost
    # The LoRA adapters (name, path) it has read, as its last result said (None: it does not say), and
    # when a waiting request first asked it to read one (planning.py _adapter_unread).
    loras_ready: set[tuple[str, str]] | None = None
    lora_asks: dict[tuple[str, str], float] = field(default_factory=dict)

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)


class Placement:
    def __init__(self, pipeline_depth: int, aging_s: float) -> None:
        self.pipeline_depth = pipeline_depth
        self.aging_s = aging_s
        self.workers: dict[str, WorkerState] = {}
        self.orphans = WaitingQueue(aging_s)  # waiting while no worker is live
        self._window_base = 0

    def add(self, worker_id: str, num_blocks: int, block_size: int) -> None:
        """A new (or new incarnation of a) worker: orphans are placed at once."""
        self.workers[worker_id] = WorkerState(
            worker_id,
            num_blocks,
            block_size,
            self.new_window(),
            WaitingQueue(self.aging_s),
            free_blocks=num_blocks,
        )
        self.place_orphans()

    def remove(self, worker_id: str) -> WorkerState | None:
        return self.workers.pop(worker_id, None)

    def new_window(self) -> PipelineWindow:
        # Step numbers never repeat across a worker's comings and goings, so a late result of a
        # dropped incarnation can never be taken for a step of the new one.
        self._window_base += 1 << 32
        return PipelineWindow(self.pipeline_depth, next_step=self._window_base)

    def place_orphans(self) -> None:
        while len(self.orphans):
            head = self.orphans.peek(0.0)
            assert head is not None
            self.orphans.pop(head)
            self.enqueue(head, front=False)

    def enqueue(self, req: Request, front: bool) -> None:
        """Wait on the least-loaded live worker; `front`: ahead of its level (it arrived before them)."""
        live = [w for w in self.workers.values() if w.suspended_at is None]
        target = min(live, key=lambda w: w.load, default=None)
        if target is None:
            req.worker_id = ""
            self.orphans.push(req)
            return
        req.worker_id = target.worker_id
        (target.waiting.push_front if front else target.waiting.push)(req)

    @property
    def num_waiting(self) -> int:
        return len(self.orphans) + sum(len(w.waiting) for w in self.workers.values())

    @property
    def num_running(self) -> int:
        return sum(len(w.running) for w in self.workers.values())
