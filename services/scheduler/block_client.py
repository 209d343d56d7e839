"""The scheduler's end of the block-manager RPC: one DEALER socket, batches sent without waiting.

A step's batch goes out and the scheduler goes on reading its sockets; the answer arrives on this
socket like any other frame and is matched to its batch by `seq` (`take`), so a block-manager stall
delays only the workers whose plans wait for an answer. Batches are applied in the order sent, so a
free sent after a batch is applied after it. A batch unanswered for `rpc_timeout_s` means the block
manager is lost. Each reply carries the block manager's `instance`: a new one means it restarted and
every table is gone. The lease owner is `<base>:<epoch>`; the epoch moves on whenever the block
manager is lost, so whatever the old owner still held simply expires and is reaped.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from pagedserve.services.scheduler.planning import StepPlan
from pagedserve.shared.pauses import AwakeSince
from pagedserve.shared.protocol.blocks import BlockAnswers, BlockBatch, BlockOp, BlockReply
from pagedserve.shared.protocol.codec import decode
from pagedserve.shared.protocol.control import Pools, PoolsReply, RenewOwner
from pagedserve.shared.protocol.frontend import Error
from pagedserve.shared.protocol.messages import message_table, read_message
from pagedserve.shared.transport import CurveKeys, make_socket, send

# What the block manager sends a scheduler: an Error answers a frame it could not read.
_REPLIES = message_table(BlockReply, PoolsReply, Error)


@dataclass(slots=True)
class Outstanding:
    sent_at: float
    plan: StepPlan | None  # None: frees whose answer nobody waits for


class BlockManagerClient:
    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        rpc_timeout_s: float,
        max_message_bytes: int,
        keys: CurveKeys | None,
        on_lost: Callable[[str], None],
    ) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.rpc_timeout_s = rpc_timeout_s
        self.max_message_bytes = max_message_bytes
        self.keys = keys
        self.on_lost = on_lost  # called after the client itself has moved to a new owner
        self.base_owner = f"scheduler-{uuid.uuid4().hex[:8]}"
        self.epoch = 0
        self.seq = 0
        self.outstanding: dict[int, Outstanding] = {}  # by seq, oldest first
        self.instance: str | None = None
        self.down = False
        self.sock = self._connect()

    @property
    def owner(self) -> str:
        return f"{self.base_owner}:{self.epoch}"

    def _connect(self) -> zmq.Socket:
        sock = make_socket(
            self.ctx, zmq.DEALER, max_message_bytes=self.max_message_bytes, curve_client=self.keys
        )
        sock.connect(self.endpoint)
        return sock

    def send(self, ops: list[BlockOp], now: float, plan: StepPlan | None = None) -> None:
        """Send one batch; its answer comes back through `take` with `plan`."""
        self.seq += 1
        send(self.sock, BlockBatch(self.seq, ops))
        self.outstanding[self.seq] = Outstanding(now, plan)

    def take(self, frame: bytes) -> tuple[StepPlan, BlockAnswers] | PoolsReply | None:
        """Read one frame off the socket: a plan's answer, the pools of a probe (the block manager
        is back), or None (an answer nobody waits for, a late one, or a restart: then it is lost).
        Raises ProtocolError for a frame that is no reply."""
        reply: Any = read_message(decode(frame, self.max_message_bytes), _REPLIES)
        if isinstance(reply, PoolsReply):
            if not self.down:
                return None
            self.down = False
            self.instance = reply.instance
            return reply
        if not isinstance(reply, BlockReply):
            return None  # an Error: the block manager could not read a frame of ours (it logged it)
        out = self.outstanding.pop(reply.seq, None)
        if out is None:
            return None  # answers a batch sent before the block manager was lost
        if self.instance is not None and reply.instance != self.instance:
            self.lost("restarted")
            return None
        self.instance = reply.instance
        return None if out.plan is None else (out.plan, reply.answer)

    def overdue(self, now: float, awake: AwakeSince) -> bool:
        """Has the oldest batch out waited past the timeout (while this process ran to read it)?"""
        oldest = next(iter(self.outstanding.values()), None)
        return oldest is not None and awake.silence(now, oldest.sent_at) > self.rpc_timeout_s

    def renew_owner(self) -> None:
        send(self.sock, RenewOwner(self.owner))

    def lost(self, reason: str) -> None:
        """Every table may be gone: a new owner, a fresh socket, then the service's own reaction."""
        self.down = True
        self.instance = None
        self.outstanding.clear()
        self.epoch += 1  # a new lease owner: leases of the old one expire and are reaped
        self.sock.close(0)  # drop anything queued for the old instance
        self.sock = self._connect()
        self.on_lost(reason)

    def probe(self) -> None:
        """While down: is it back? Its PoolsReply comes through `take`."""
        self.seq += 1
        send(self.sock, Pools(self.seq))

    def close(self) -> None:
        self.sock.close(0)
