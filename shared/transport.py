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


def send(sock: zmq.Socket, message: Any, to: bytes | None = None) -> None:
    """One declared message (shared/protocol) to a DEALER peer, or [identity, frame] from a ROUTER.

    Never blocks: a full queue drops."""
    frame = encode_message(message)
    try:
        if to is None:
            sock.send(frame, zmq.NOBLOCK)
        else:
            sock.send_multipart([to, frame], zmq.NOBLOCK)
    except zmq.Again:
        pass  # the peer is gone or hopelessly behind; its timeout handles it


def recv_router(sock: zmq.Socket, max_bytes: int) -> tuple[bytes, dict[str, Any]]:
    """(identity, message) from a ROUTER; raises ProtocolError (with the identity known) on a bad frame."""
    parts = sock.recv_multipart(zmq.NOBLOCK)
    identity, frames = parts[0], parts[1:]
    # DEALERs send one frame; REQ-style peers add an empty delimiter first.
    if len(frames) == 2 and frames[0] == b"":
        frames = frames[1:]
    if len(frames) != 1:
        raise RouterFrameError(identity, ProtocolError("bad_frame", f"expected one frame, got {len(frames)}"))
    try:
        return identity, decode(frames[0], max_bytes)
    except Exception as exc:
        raise RouterFrameError(identity, exc) from None


class RouterFrameError(Exception):
    def __init__(self, identity: bytes, error: Exception) -> None:
        super().__init__(str(error))
        self.identity = identity
        self.error = error
