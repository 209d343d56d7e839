"""Run the API on uvicorn until SIGTERM/SIGINT: `pagedserve api` and `python -m pagedserve.services.api`."""

from __future__ import annotations

import socket

import uvicorn
from pagedserve.services.api.app import create_app
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.log import configure_logging


def base_url(config: ServeConfig) -> str:
    host = "127.0.0.1" if config.api_host in ("0.0.0.0", "", "::") else config.api_host
    return f"http://{host}:{config.api_port}/v1"


def run(config: ServeConfig) -> None:
    log = configure_logging("api", config.log_format, config.log_level)
    app = create_app(config)
    log.info("api_starting", base_url=base_url(config), model=config.model, served_as=app.state.model_name)
    # uvicorn handles SIGTERM/SIGINT itself: it stops accepting, finishes (or times out) open
    # requests, then runs the lifespan's exit, which closes the SDK client (aborting what is live).
    settings = uvicorn.Config(
        app,
        host=config.api_host,
        port=config.api_port,
        log_level="warning" if config.log_level == "info" else config.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(settings)
    if config.api_processes == 1:
        server.run()
        return
    # Several API processes on one port: the kernel spreads new connections over them, and each
    # has its own SDK client, so one's death ends only the streams it held.
    server.run(sockets=[shared_port_socket(config.api_host, config.api_port)])


def shared_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port) that other processes may bind too (SO_REUSEPORT). Only
    when asked for: by default a second server on a taken port must fail, not share its traffic."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
