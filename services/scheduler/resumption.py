"""A worker lost with its pool in shared memory: its requests wait for it and resume where they were.

When a worker whose pool outlives it (a segment its supervisor owns) is lost, its running requests
are not recomputed elsewhere. They stay on it, *suspended*, taken back to their committed slots (the
slots of steps whose results came back: that KV is known written). The steps in flight are lost;
whatever they wrote lies past the committed slots and is written again by the replayed step. If the
worker comes back with its pool continued (the block manager kept the tables: same segment epoch),
each request is sent to it as new, with its committed slots counted as computed, and continues with
0 prefill tokens computed again. If it does not come back in time, or comes back with a fresh pool,
the requests recompute elsewhere as before (Scheduler.remove_worker).

A request cannot resume, and recomputes at once elsewhere, when nothing of it was committed (its
first step was lost), when a lost step copied or forked its blocks (the copy may never have been
made), or when it wants prompt logprobs it has not received (the worker accumulates them across
chunks, and that tally died).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedserve.services.scheduler.request import Request, Status
from pagedserve.shared.protocol.blocks import BlockOp, Free

if TYPE_CHECKING:
    from pagedserve.services.scheduler.placement import WorkerState


@dataclass(slots=True)
class Suspension:
    frees: list[BlockOp] = field(default_factory=list)  # ops to send the block manager now
    parked: list[Request] = field(default_factory=list)  # waiting for the worker, to resume
    moved: list[Request] = field(default_factory=list)  # to recompute (or start) on another worker
    released: list[Request] = field(default_factory=list)  # finished: the scheduler forgets them


def suspend(
    state: WorkerState, requests: list[Request], now: float, epoch: str, incarnation: str
) -> Suspension:
    """Take every request of `state` back to what is committed; those that can resume stay parked on
    it. `requests`: every request the scheduler holds on this worker."""
    out = Suspension()
    lost = list(state.window.steps)  # none of these will be answered
    unsafe = frozenset().union(*(step.unsafe for step in lost))
    state.window = type(state.window)(state.window.depth, next_step=state.window.next_step)
    state.suspended_at, state.pool_epoch, state.incarnation = now, epoch, incarnation
    # Nothing of this list reached the worker that is gone, nor will a restarted one know them.
    state.forget.clear()
    out.frees.extend(Free(rid, 0) for rid in state.stray)
    state.stray.clear()
    state.to_free.clear()
    for req in requests:
        if req.status is Status.WAITING:
            state.waiting.remove(req)
            out.moved.append(req)
            continue
        req.in_flight = req.pending = 0
        req.num_slots_used = req.num_committed  # a free below says: only these slots were written
        req.num_slots_given = req.num_committed  # the resume op takes the table back there
        req.lookahead_in_flight = 0  # the proposals of lost steps are lost with them
        if req.status is Status.FINISHED:
            out.frees.append(Free(req.request_id, req.num_slots_used))
            out.released.append(req)
        elif req.status is Status.RUNNING and resumable(req, unsafe):
            req.on_worker = False
            req.resume = True
            out.parked.append(req)
        else:  # preempted on its way out, or it cannot resume: it recomputes elsewhere
            out.frees.append(Free(req.request_id, 0 if req.status is Status.RUNNING else req.num_slots_used))
            req.lost_committed = req.num_committed if req.status is Status.RUNNING else 0
            req.reset_to_waiting()
            out.moved.append(req)
    state.running = [r for r in state.running if r in out.parked]
    return out


def resumable(req: Request, unsafe: frozenset[str]) -> bool:
    return req.num_committed > 0 and req.request_id not in unsafe and not req.wants_prompt_logprobs


def can_resume(state: WorkerState, epoch: str, incarnation: str, continued: bool) -> bool:
    """The worker that announced itself holds the pool the suspended requests wait for: the same
    process (a pause, a reconnect), or a new one that mapped the same segment and whose registration
    the block manager continued (it kept the tables)."""
    if state.suspended_at is None or not epoch or epoch != state.pool_epoch:
        return False
    return incarnation == state.incarnation or continued
