"""CURVE keys for the client, read from the files `zmq.auth.create_certificates` writes."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import zmq.auth


class ClientKeys(TypedDict):
    """Keyword arguments for Client / AsyncClient."""

    curve_server_public_key: bytes
    curve_client_keys: tuple[bytes, bytes]


def load_client_keys(keys_dir: str | Path) -> ClientKeys:
    """Read `client.key_secret` (the client's pair) and `server.key` (the server's public key).

    client = Client("tcp://10.0.0.5:5555", **load_client_keys("keys/"))
    """
    keys_dir = Path(keys_dir)
    public, secret = zmq.auth.load_certificate(keys_dir / "client.key_secret")
    server_public, _ = zmq.auth.load_certificate(keys_dir / "server.key")
    if secret is None:
        raise ValueError(f"{keys_dir / 'client.key_secret'} holds no secret key")
    return {"curve_server_public_key": server_public, "curve_client_keys": (public, secret)}
