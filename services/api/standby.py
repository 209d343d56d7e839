"""A standby API process: started ahead, its app built, waiting to take a dead API process's place.

An API process's start is mostly Python imports and the model card (its tokenizer and template);
under load, on a busy CPU, that is seconds. So the supervisor keeps one process that has done all
of it and waits: when an API process dies it writes one JSON line to the standby's stdin,

    {"args": [...], "log": "/path/api.log" | null}

and the standby becomes it: its log file from then on, its failpoints, then the port and the
connection to the scheduler (server.py), while a new standby starts in the background. An empty
stdin (the supervisor stopped or died) ends the standby.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from pagedserve.shared import failpoints
from pagedserve.shared.standby import wait_for_order


def wait_for_place(log: Any) -> None:
    args_given = wait_for_order(log)
    parser = argparse.ArgumentParser(prog="pagedserve api (standby)")
    parser.add_argument("--failpoints", default=None)
    args = parser.parse_args(args_given)
    failpoints.configure(args.failpoints)
    log.info("standby_promoted", pid=os.getpid())
