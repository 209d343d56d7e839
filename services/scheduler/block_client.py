"""The scheduler's end of the block-manager RPC: one DEALER socket, one batch per step.

Each batch carries a `seq`, so a late reply to a batch that timed out is never taken for the
current one. Each reply carries the block manager's `instance`: a new one means it restarted and
every table is gone. The lease owner is `<base>:<epoch>`; the epoch moves on whenever the block
manager is lost, so whatever the old owner still held simply expires and is reaped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import zmq

from pagedserve.shared.protocol.blocks import BlockAnswers, BlockBatch, BlockOp, BlockReply
from pagedserve.shared.protocol.codec import decode
from pagedserve.shared.protocol.control import Pools, PoolsReply, RenewOwner
from pagedserve.shared.protocol.frontend import Error
from pagedserve.shared.protocol.messages import message_table, read_message
from pagedserve.shared.transport import CurveKeys, make_socket, send

# What the block manager sends a scheduler: an Error answers a frame it could not read.
_REPLIES = message_table(BlockReply, PoolsReply, Error)


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

    def rpc(self, ops: list[BlockOp]) -> BlockAnswers | None:
        """One batched RPC; None if the block manager did not answer in time (it is then down)."""
        self.seq += 1
        seq = self.seq
        send(self.sock, BlockBatch(seq, ops))
        deadline = time.monotonic() + self.rpc_timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                break
            reply = read_message(decode(self.sock.recv(), self.max_message_bytes), _REPLIES)
            if not isinstance(reply, BlockReply) or reply.seq != seq:
                continue  # a late reply to a batch that timed out, or a probe's
            if self.instance is not None and reply.instance != self.instance:
                self.lost("restarted")
                return None
            self.instance = reply.instance
            return reply.answer
        self.lost("timeout")
        return None

    def renew_owner(self) -> None:
        send(self.sock, RenewOwner(self.owner))

    def lost(self, reason: str) -> None:
        """Every table may be gone: a new owner, a fresh socket, then the service's own reaction."""
        self.down = True
        self.instance = None
        self.epoch += 1  # a new lease owner: leases of the old one expire and are reaped
        self.sock.close(0)  # drop anything queued for the old instance
        self.sock = self._connect()
        self.on_lost(reason)

    def probe(self) -> PoolsReply | None:
        """While down: is it back? Its pools then, and it is up again."""
        self.seq += 1
        send(self.sock, Pools(self.seq))
        if not self.sock.poll(200):
            return None
        reply = read_message(decode(self.sock.recv(), self.max_message_bytes), _REPLIES)
        if not isinstance(reply, PoolsReply):
            return None
        self.down = False
        self.instance = reply.instance
        return reply

    def close(self) -> None:
        self.sock.close(0)
