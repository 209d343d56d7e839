"""The folder of a deployment's KV segments: created by its supervisor, gone when the deployment is.

Why the supervisor owns the segments (and not the block manager): the bytes must live on the
workers' machine, and the block manager may be on another one; the supervisor runs beside its
workers, outlives each of them (it restarts them), and a worker cannot outlive it (the kernel
SIGKILLs its children when it dies). So a segment lives exactly as long as a worker can use it.

    /dev/shm/pagedserve-kv-<supervisor pid>-<random>/worker-0.kv ...

It is removed when the deployment stops, and also when the supervisor is SIGKILLed: a sweeper
process (its own session, so the kernel's parent-death signal does not reach it) blocks reading a
pipe whose only writer is the supervisor; when that end closes, however the supervisor ended, the
read returns and the sweeper removes the folder. tmpfs frees the memory once the last worker that
maps a removed file is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Run with -I -S: no site, no pagedserve import; a few milliseconds and a few MiB.
_SWEEPER = """
import os, shutil, sys
while os.read(0, 4096):
    pass
shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


def segment_root() -> Path:
    """Shared memory where the machine has it (/dev/shm), else the temp folder (any file maps)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class SegmentFolder:
    def __init__(self, root: Path | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=f"pagedserve-kv-{os.getpid()}-", dir=root or segment_root()))
        self._sweeper: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _SWEEPER, str(self.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal must not take it before us
            close_fds=True,
        )

    def segments(self) -> list[Path]:
        return sorted(self.path.glob("*.kv")) if self.path.is_dir() else []

    def remove(self) -> None:
        """After the workers have stopped: the folder, and the sweeper with nothing left to do."""
        shutil.rmtree(self.path, ignore_errors=True)
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None and sweeper.stdin is not None:
            with contextlib.suppress(OSError):
                sweeper.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                sweeper.wait(timeout=5)
