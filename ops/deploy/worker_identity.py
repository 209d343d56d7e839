"""A worker's name when none is configured and it runs in a container.

Under `network_mode: host` every replica sees the host's hostname and is pid 1, so the
service's default (`host-pid`) would give all replicas of `--scale worker=N` the same name.
The container id is unique per replica and matches `docker ps`.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from pathlib import Path

# Docker and Podman bind-mount /etc/hostname (and resolv.conf, hosts) from the container's own
# folder, whose name is its id: visible in mountinfo whatever the network mode.
_CONTAINER_ID = re.compile(r"/containers/(?:overlay-containers/)?([0-9a-f]{64})/")
_MARKERS = (Path("/.dockerenv"), Path("/run/.containerenv"))


def state_dir() -> Path:
    """This run's own state folder: $PAGEDSERVE_STATE_DIR, else the user's XDG state folder. In a
    container that is the container's own home, so replicas sharing volumes never share it."""
    configured = os.environ.get("PAGEDSERVE_STATE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_STATE_HOME") or "~/.local/state").expanduser() / "pagedserve"


def worker_id_file() -> Path:
    """Where a containerised worker leaves its name for the compose healthcheck (docker-compose.yml)."""
    return state_dir() / "worker-id"


def in_container() -> bool:
    return any(marker.exists() for marker in _MARKERS)


def container_id(mountinfo: str | None = None) -> str | None:
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    match = _CONTAINER_ID.search(mountinfo)
    return match.group(1) if match else None


def container_worker_id(mountinfo: str | None = None) -> str:
    """`<hostname>-<container id[:12]>`, or a random suffix when the id cannot be read."""
    suffix = (container_id(mountinfo) or secrets.token_hex(6))[:12]
    return f"{socket.gethostname()[:40]}-{suffix}"
