"""CURVE key pairs for encrypted, authenticated ZeroMQ between clients and the scheduler.

Layout of the folder (the one `curve_keys_dir` points at):
    server.key, server.key_secret      the services' pair
    client.key, client.key_secret      a client's pair
    authorized/client.key              public keys the server accepts (add more clients here)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import zmq.auth

SECRET_MODE = 0o600
DIR_MODE = 0o700


def create_keys(directory: Path, force: bool = False) -> dict[str, Path]:
    """Write the server and client pairs and `authorized/`; refuse to overwrite without `force`,
    since replacing a live server key locks every client out."""
    directory.mkdir(parents=True, exist_ok=True)
    existing = [p for p in (directory / "server.key_secret", directory / "client.key_secret") if p.exists()]
    if existing and not force:
        raise FileExistsError(f"{existing[0]} exists; pass --force to replace the keys")
    os.chmod(directory, DIR_MODE)
    server_public, server_secret = zmq.auth.create_certificates(str(directory), "server")
    client_public, client_secret = zmq.auth.create_certificates(str(directory), "client")
    for secret in (server_secret, client_secret):
        os.chmod(secret, SECRET_MODE)
    authorized = directory / "authorized"
    authorized.mkdir(exist_ok=True)
    shutil.copyfile(client_public, authorized / "client.key")
    return {
        "server_public": Path(server_public),
        "server_secret": Path(server_secret),
        "client_public": Path(client_public),
        "client_secret": Path(client_secret),
        "authorized": authorized,
    }
