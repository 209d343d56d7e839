"""ZeroMQ helpers every service uses: sockets with limits set, frames in and out, CURVE keys.

Every socket gets a maximum message size (a huge frame is dropped by ZeroMQ before it reaches us),
linger 0 (a dead peer never blocks shutdown), and, when keys are configured, CURVE encryption with
only the authorized client keys accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth

from pagedserve.shared.protocol.codec import ProtocolError, decode
from pagedserve.shared.protocol.messages import encode_message


def _key_pair(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) from a *.key_secret file; a file without the secret is named, not used as None."""
    public, secret = zmq.auth.load_certificate(str(path))
    if secret is None:
        raise ValueError(f"{path}: holds no secret key (a public .key file under the secret's name?)")
    return public, secret


@dataclass(slots=True)
class CurveKeys:
    """Key files written by `pagedserve keys --dir DIR` (zmq.auth certificate format)."""

    directory: Path

    @property
    def authorized_dir(self) -> Path:
        return self.directory / "authorized"

    def server_pair(self) -> tuple[bytes, bytes]:
        return _key_pair(self.directory / "server.key_secret")

    def client_pair(self) -> tuple[bytes, bytes]:
        return _key_pair(self.directory / "client.key_secret")

    def server_public(self) -> bytes:
        public, _ = zmq.auth.load_certificate(str(self.directory / "server.key"))
        return public


def make_socket(
    ctx: zmq.Context,
    kind: int,
    *,
    max_message_bytes: int,
    identity: str | None = None,
    curve_server: CurveKeys | None = None,
    curve_client: CurveKeys | None = None,
) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    # ZeroMQ drops a peer that sends more than MAXMSGSIZE without a word. Up to twice the limit we
    # still read the frame, so `decode` can answer "too large" naming the limit; beyond that the
    # hard cap protects memory.
    sock.setsockopt(zmq.MAXMSGSIZE, 2 * max_message_bytes)
    if kind == zmq.ROUTER:
        # A peer that reconnects with the identity of a dead one takes over its route.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity.encode())
    if curve_server is not None:
        public, secret = curve_server.server_pair()
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True
    if curve_client is not None:
        public, secret = curve_client.client_pair()
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_serverkey = curve_client.server_public()
    return sock


def start_authenticator(ctx: zmq.Context, keys: CurveKeys) -> Any:
    """Accept CURVE clients whose public key lies in keys/authorized; refuse everyone else."""
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(keys.authorized_dir))
    return auth


Route = tuple[bytes, ...]
"""The frames before a message on a ROUTER: the sender's identity; behind `pagedserve router`, the
router's own hop first, then its client's identity (the scheduler answers along the same frames)."""

MAX_HOPS = 2  # a client, or a client behind one router


def send(sock: zmq.Socket, message: Any, to: bytes | Route | None = None) -> None:
    """One declared message (shared/protocol) to a DEALER peer, or [identity..., frame] from a ROUTER.

    Never blocks: a full queue drops."""
    frame = encode_message(message)
    try:
        if to is None:
            sock.send(frame, zmq.NOBLOCK)
        elif isinstance(to, bytes):
            sock.send_multipart([to, frame], zmq.NOBLOCK)
        else:
            sock.send_multipart([*to, frame], zmq.NOBLOCK)
    except zmq.Again:
        pass  # the peer is gone or hopelessly behind; its timeout handles it


def recv_routed(sock: zmq.Socket, max_bytes: int, max_hops: int = MAX_HOPS) -> tuple[Route, dict[str, Any]]:
    """(route, message) from a ROUTER; raises ProtocolError (with the route known) on a bad frame."""
    parts = sock.recv_multipart(zmq.NOBLOCK)
    *route, frame = parts
    # REQ-style peers put an empty delimiter between the identity and the frame; no hop is empty.
    if len(route) > 1 and route[-1] == b"":
        route.pop()
    if len(route) > max_hops:
        raise RouterFrameError(
            tuple(route[:1]), ProtocolError("bad_frame", f"expected one frame, got {len(parts) - 1}")
        )
    try:
        return tuple(route), decode(frame, max_bytes)
    except Exception as exc:
        raise RouterFrameError(tuple(route), exc) from None


def recv_router(sock: zmq.Socket, max_bytes: int) -> tuple[bytes, dict[str, Any]]:
    """(identity, message) from a ROUTER whose peers connect directly (workers, schedulers)."""
    route, message = recv_routed(sock, max_bytes, max_hops=1)
    return route[0], message


class RouterFrameError(Exception):
    def __init__(self, identity: Route, error: Exception) -> None:
        super().__init__(str(error))
        self.identity = identity
        self.error = error
