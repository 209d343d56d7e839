"""A standby process's wait: started ahead and ready, it becomes a process that died.

The supervisor writes one JSON line to the standby's stdin,

    {"args": [...], "log": "/path/<name>.log" | null}

`args` are the dead process's own extra command line (its name, its failpoints in a test
deployment); `log` is its log file, which the standby writes from then on. An empty stdin (the
supervisor stopped or died) ends the standby. What each kind does first (the worker's model load,
the API's app) and with the args is in services/worker/standby.py and services/api/standby.py.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def wait_for_order(log: Any) -> list[str]:
    """Block until the supervisor names the place to take; its log file from then on. The args."""
    log.info("standby_ready", pid=os.getpid())
    line = sys.stdin.readline()
    if not line.strip():
        log.info("standby_released")
        sys.exit(0)
    order = json.loads(line)
    if order.get("log"):
        # From here on we are that process: its log file, not the standby's.
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(order["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    return list(order.get("args", []))
