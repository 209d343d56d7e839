"""A standby worker: started ahead, model loaded, waiting for the name of a worker that died.

A worker's restart is mostly `import torch` and the model load (seconds on a CPU); the pool itself
is only mapped again (kv_segment.py). So the supervisor keeps one process that has done all of that
and is nameless: when worker-N dies it writes one JSON line to the standby's stdin,

    {"args": ["--worker-id", "worker-N", ...], "log": "/path/worker-N.log" | null}

and the standby becomes worker-N (maps its segment, registers, serves) within a fraction of a
second, while a new standby loads in the background. `args` are the dead worker's own extra command
line (its name, its failpoints in a test deployment). An empty stdin (the supervisor stopped or died)
ends the standby.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from pagedserve.shared import failpoints
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.standby import wait_for_order


def wait_for_name(config: ServeConfig, log: Any) -> ServeConfig:
    args_given = wait_for_order(log)
    parser = argparse.ArgumentParser(prog="pagedserve worker (standby)")
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--failpoints", default=None)
    args = parser.parse_args(args_given)
    failpoints.configure(args.failpoints)
    log.info("standby_promoted", worker_id=args.worker_id, pid=os.getpid())
    return config.model_copy(update={"worker_id": args.worker_id})
