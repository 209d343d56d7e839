"""Files derived from a model and kept for the next start: `$PAGEDSERVE_CACHE` (default
`~/.cache/pagedserve`). Only small derived files live here (a GGUF's tokenizer); never weights."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("PAGEDSERVE_CACHE") or "~/.cache/pagedserve").expanduser()


def publish_atomically(destination: Path, write: Callable[[Path], None]) -> None:
    """Run `write(folder)` on a fresh temporary folder beside `destination`, then rename it into place.

    A rename within one file system is atomic, so `destination` is either absent or complete: an
    interrupted or failed write leaves at most a `.tmp-*` folder, which is removed when possible.
    Two processes publishing the same folder at once both succeed; the second's copy is dropped.
    """
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.tmp-", dir=destination.parent))
    try:
        write(staging)
        staging.chmod(0o755)  # mkdtemp makes it private; the cache may be shared by several users
        try:
            staging.rename(destination)
        except OSError:
            if not destination.is_dir():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
