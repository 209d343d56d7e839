"""The SDK's link to the scheduler's front ROUTER: one DEALER, re-made from scratch on reconnect.

A DEALER reconnects TCP by itself, but a scheduler that restarted has forgotten our requests, and
its Pongs would keep a silence clock happy forever. So the socket's monitor reports a dropped
connection, and then (or after reconnect_after_s of silence) we open a new socket and re-submit
every live request with attach=True.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from pagedserve.shared.sdk.session import PING_FRAME, Session

log = logging.getLogger("pagedserve.sdk")

# Linger on close: long enough for the final Aborts to leave, short enough that close() is prompt.
CLOSE_LINGER_MS = 100
RECV_BATCH = 256


@dataclass(frozen=True, slots=True)
class SocketOptions:
    endpoint: str
    max_message_bytes: int
    curve_server_public_key: bytes | None = None
    curve_client_keys: tuple[bytes, bytes] | None = None

    def __post_init__(self) -> None:
        if self.curve_client_keys is not None and self.curve_server_public_key is None:
            raise ValueError("curve_client_keys needs curve_server_public_key too")


class Connection:
    def __init__(self, ctx: zmq.Context, options: SocketOptions, min_reopen_s: float) -> None:
        self._ctx = ctx
        self._options = options
        # A peer that drops every handshake (a wrong CURVE key) must not make us spin.
        self._min_reopen_s = min_reopen_s
        self._lost = False
        self._opened_at = 0.0
        self.generation = 0  # bumps on every reopen: pollers re-register
        self.dealer, self.monitor = self._open()

    def _open(self) -> tuple[zmq.Socket, zmq.Socket]:
        o = self._options
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, o.max_message_bytes)
        # Unbounded send queue: it holds at most the live requests' submits and a few pings, and
        # the socket is thrown away on reconnect. A bounded one would drop submits of a burst.
        sock.setsockopt(zmq.SNDHWM, 0)
        if o.curve_server_public_key is not None:
            public, secret = o.curve_client_keys or zmq.curve_keypair()  # ephemeral: encrypted, anonymous
            sock.curve_secretkey = secret
            sock.curve_publickey = public
            sock.curve_serverkey = o.curve_server_public_key
        monitor = sock.get_monitor_socket(
            zmq.EVENT_DISCONNECTED, f"inproc://pagedserve-sdk-mon-{uuid.uuid4().hex}"
        )
        sock.connect(o.endpoint)
        return sock, monitor

    def reopen(self, now: float) -> None:
        self._close_sockets(linger_ms=0)
        self.dealer, self.monitor = self._open()
        self.generation += 1
        self._opened_at = now
        self._lost = False

    def send(self, frame: bytes) -> None:
        try:
            self.dealer.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # not with SNDHWM=0, but never block the I/O loop
            log.warning("pagedserve sdk: send queue full; the frame waits for the next reconnect")

    def service(self, session: Session, ready: set[zmq.Socket], now: float) -> None:
        """One turn of the I/O loop after a poll: read, then run the clocks."""
        if self.dealer in ready:
            # At most a batch per turn: the clocks still run, and an asyncio loop gets its turn.
            for _ in range(RECV_BATCH):
                try:
                    frame = self.dealer.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                session.on_frame(frame, now)
            for frame in session.take_outbox():
                self.send(frame)
        if self.monitor in ready:
            self._lost |= self._drain_monitor()
        if not session.live:
            self._lost = False  # idle: ZeroMQ reconnects by itself and there is nothing to re-submit
        for frame in session.expire(now):
            self.send(frame)
        lost = self._lost and now - self._opened_at >= self._min_reopen_s
        if lost or session.reconnect_due(now):
            log.info(
                "pagedserve sdk: reconnecting to %s (%s)",
                self._options.endpoint,
                "connection dropped" if lost else "server silent",
            )
            self.reopen(now)
            for frame in session.resubmit(now):
                self.send(frame)
        elif session.ping_due(now):
            self.send(PING_FRAME)

    def _drain_monitor(self) -> bool:
        dropped = False
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return dropped
            dropped |= event["event"] == zmq.EVENT_DISCONNECTED

    def close(self, linger_ms: int = CLOSE_LINGER_MS) -> None:
        self._close_sockets(linger_ms)

    def _close_sockets(self, linger_ms: int) -> None:
        with contextlib.suppress(zmq.ZMQError):  # already closed
            self.dealer.disable_monitor()
        self.monitor.close(linger=0)
        self.dealer.close(linger=linger_ms)


class Waker:
    """Wakes the I/O loop from other threads or tasks: an inproc PAIR whose read end the loop polls.

    The send end is shared by the callers, so it sits behind a lock (ZeroMQ sockets are not thread-safe)."""

    def __init__(self, ctx: zmq.Context) -> None:
        address = f"inproc://pagedserve-sdk-wake-{uuid.uuid4().hex}"
        self.rx = ctx.socket(zmq.PAIR)
        self.rx.bind(address)
        self._tx = ctx.socket(zmq.PAIR)
        self._tx.connect(address)
        self._lock = threading.Lock()

    def wake(self) -> None:
        with self._lock:
            if self._tx.closed:
                return
            with contextlib.suppress(zmq.Again):  # a wake-up is already pending
                self._tx.send(b"", zmq.NOBLOCK)

    def drain(self) -> None:
        while True:
            try:
                self.rx.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def close(self) -> None:
        with self._lock:
            self._tx.close(linger=0)
        self.rx.close(linger=0)
