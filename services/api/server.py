"""Run the API on uvicorn until SIGTERM/SIGINT: `pagedserve api` and `python -m pagedserve.services.api`."""

from __future__ import annotations

import os
import resource
import socket
from pathlib import Path

import uvicorn

from pagedserve.services.api.api_keys import KeysFileError
from pagedserve.services.api.app import create_app
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.log import configure_logging


def base_url(config: ServeConfig) -> str:
    host = "127.0.0.1" if config.api_host in ("0.0.0.0", "", "::") else config.api_host
    return f"http://{host}:{config.api_port}/v1"


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), for the start log; None elsewhere."""
    try:
        started_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime_s - started_ticks / os.sysconf("SC_CLK_TCK")


def run(config: ServeConfig, standby: bool = False) -> None:
    """`standby`: build the app, then wait to take a dead API process's place (standby.py)."""
    log = configure_logging("api", config.log_format, config.log_level)
    imported_at = process_age_s()
    open_files = raise_open_files_limit()
    try:
        app = create_app(config)
    except KeysFileError as exc:  # the file's name and its problem, not a traceback
        log.error("api_keys_file_refused", reason=str(exc))
        raise SystemExit(f"pagedserve api: {exc}") from None
    app.state.start_phases = {"imported_s": imported_at, "app_built_s": process_age_s()}
    if standby:
        from pagedserve.services.api.standby import wait_for_place

        wait_for_place(log)
        app.state.start_phases["promoted_s"] = process_age_s()  # the phases before it ran ahead
    log.info(
        "api_starting",
        base_url=base_url(config),
        model=config.model,
        served_as=app.state.model_name,
        open_files=open_files,
    )
    # uvicorn handles SIGTERM/SIGINT itself: it stops accepting, finishes (or times out) open
    # requests, then runs the lifespan's exit, which closes the SDK client (aborting what is live).
    settings = uvicorn.Config(
        app,
        host=config.api_host,
        port=config.api_port,
        log_level="warning" if config.log_level == "info" else config.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
        # uvicorn's default (5 s) equals httpx's pool expiry: a pooled connection the client still
        # trusts was being closed as the next request went out on it (docs/failure-model.md).
        # uvicorn annotates it int, but only hands it to loop.call_later, which takes a float.
        timeout_keep_alive=config.api_keep_alive_s,  # pyright: ignore[reportArgumentType]
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


def raise_open_files_limit() -> int:
    """Lift the soft open-files limit to the hard one: each HTTP connection (idle keep-alives too)
    holds a descriptor, and a soft 1,024 would refuse the 1,025th client with EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target
