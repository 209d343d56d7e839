"""Which workers are alive: heartbeats, hellos from step sockets, closed connections, late steps.

A worker is `routable` once its step socket has spoken (after a scheduler restart the heartbeat
socket may reconnect first, and a ROUTER drops a message to an identity it does not know), and
`active` once the core knows it. Deaths are noticed by heartbeats, sped up by the socket: for a
moment after a connection closes, the heartbeat timeout drops to 1.5 heartbeats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pagedserve.services.scheduler.step_clock import StepClock
from pagedserve.shared.pauses import AwakeSince
from pagedserve.shared.protocol.control import WorkerAnnouncement

# How a step timeout's reason begins (the live view and the metrics count them).
STEP_UNANSWERED = "step unanswered"


@dataclass(slots=True)
class WorkerLink:
    worker_id: str
    incarnation: str
    num_blocks: int
    block_size: int
    max_model_len: int  # the longest context it announced it serves
    last_heartbeat: float
    active: bool = False  # known to the core (its pool is registered and reachable)
    routable: bool = False  # its step socket has spoken to us: steps sent to it arrive
    generation: int = 0  # sent with the reset that activated it: only results stamped so are believed
    model: str = ""
    runtime: dict[str, str] = field(default_factory=dict)  # as it last announced (dtype, ISA paths)
    dumped_for: float | None = None  # sent_at of the step whose suspected hang was already dumped
    connection: int = 0  # the step socket's connection number, from its last Hello
    pool_epoch: str = ""  # its pool's shared-memory segment ("" when the pool dies with it)
    pool_continued: bool = False  # the block manager kept its pool's tables when it registered


class WorkerLiveness:
    def __init__(self, heartbeat_interval_s: float, worker_timeout_s: float, steps: StepClock) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.worker_timeout_s = worker_timeout_s
        self.steps = steps  # measured step times: the step timeout of each worker
        self.links: dict[str, WorkerLink] = {}
        self.disconnect_seen_at = float("-inf")
        self.awake = AwakeSince()  # our own pauses are not the workers' silence (the loop notes its turns)

    def restarted(self, msg: WorkerAnnouncement) -> bool:
        """Same name, new process: its old state is gone."""
        link = self.links.get(msg.worker_id)
        return link is not None and link.incarnation != msg.incarnation

    def reconnected(self, msg: WorkerAnnouncement, step_socket: bool) -> bool:
        """Same process, new step connection (ROUTER_HANDOVER moved its route): steps sent on the
        old connection may have been dropped with it, silently."""
        link = self.links.get(msg.worker_id)
        return (
            step_socket
            and link is not None
            and link.active
            and link.incarnation == msg.incarnation
            and link.connection not in (0, msg.connection)
        )

    def heard(self, msg: WorkerAnnouncement, now: float, step_socket: bool) -> tuple[WorkerLink, bool]:
        """(its link, whether it just joined)."""
        link = self.links.get(msg.worker_id)
        joined = link is None
        if link is None:
            link = self.links[msg.worker_id] = WorkerLink(
                msg.worker_id, msg.incarnation, msg.num_blocks, msg.block_size, msg.max_model_len, now
            )
        link.last_heartbeat = now
        link.routable = link.routable or step_socket
        if step_socket and msg.connection:
            link.connection = msg.connection
        link.model, link.runtime = msg.model, msg.runtime
        link.pool_epoch, link.pool_continued = msg.pool_epoch, msg.pool_continued
        return link, joined

    def view(self, now: float) -> list[dict[str, object]]:
        """Every known worker, for the ops `/workers` route."""
        return [
            {
                "worker_id": link.worker_id,
                "active": link.active,
                "num_blocks": link.num_blocks,
                "block_size": link.block_size,
                "model": link.model,
                "runtime": dict(link.runtime),
                "last_heartbeat_age_s": round(now - link.last_heartbeat, 3),
            }
            for link in list(self.links.values())  # read from the ops thread
        ]

    def touch(self, worker_id: str, now: float) -> None:
        """A step result is a sign of life too."""
        link = self.links.get(worker_id)
        if link is not None:
            link.last_heartbeat = now

    def drop(self, worker_id: str) -> WorkerLink | None:
        self.steps.forget(worker_id)  # it may come back on other hardware, or loaded differently
        return self.links.pop(worker_id, None)

    def connection_closed(self, now: float) -> None:
        self.disconnect_seen_at = now

    def overdue(
        self, now: float, oldest_step_sent_at: Callable[[str], float | None]
    ) -> list[tuple[str, str]]:
        """(worker id, why) of every worker to declare lost now."""
        timeout = self.worker_timeout_s
        if now - self.disconnect_seen_at < timeout:
            # Some worker connection just closed: whoever also missed a heartbeat and a half is gone.
            timeout = min(timeout, 1.5 * self.heartbeat_interval_s)
        lost = []
        for wid, link in self.links.items():
            silent = self.awake.silence(now, link.last_heartbeat)
            oldest = oldest_step_sent_at(wid)
            if silent > timeout:
                lost.append((wid, f"no heartbeat for {silent:.1f}s"))
            elif oldest is not None and self.awake.silence(now, oldest) > self.steps.timeout_s(wid):
                lost.append((wid, f"{STEP_UNANSWERED} for {now - oldest:.1f}s"))
        return lost

    def suspected_hangs(self, now: float, oldest_step_sent_at: Callable[[str], float | None]) -> list[str]:
        """Workers whose oldest step just passed its hang threshold (each such step once)."""
        suspects = []
        for wid, link in self.links.items():
            oldest = oldest_step_sent_at(wid)
            if oldest is None or oldest == link.dumped_for:
                continue
            if now - oldest > self.steps.dump_after_s(wid):
                link.dumped_for = oldest
                suspects.append(wid)
        return suspects

    def active_ids(self) -> list[str]:
        return [w for w, link in self.links.items() if link.active]

    def served_len(self, model_len: int) -> int:
        """The longest context every active worker serves: a request admitted against it runs on
        any of them (a worker may cap the checkpoint's positions, at a sliding window say)."""
        return min([model_len] + [link.max_model_len for link in self.links.values() if link.active])
