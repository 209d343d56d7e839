"""A child process that dies with its parent (Linux's parent-death signal): no orphan outlives the
process that started it, whoever stops or kills that one."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Run in the child (a Popen preexec_fn): the kernel SIGKILLs it when the spawning thread dies
    without stopping it (SIGKILLed, or crashed), so no orphan keeps ports or memory. SIGKILL, not
    SIGTERM: nobody is left to SIGCONT a stopped child, and a stopped child never runs a SIGTERM
    handler."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    # The parent may have died between fork and prctl: then nobody would ever stop us.
    if os.getppid() != parent_pid:
        os._exit(1)
