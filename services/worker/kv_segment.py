"""A worker's KV pool in a named shared-memory segment that outlives the worker process.

    <kv_segment_dir>/<worker_id>.kv     one file in a tmpfs folder the deployment's supervisor owns

    offset 0      8 bytes   magic, written last: a segment killed while being set up has none
    offset 8      8 bytes   pid of the holder (little endian), for the refusal of a duplicate
    offset 16     4 bytes   length of the JSON that follows
    offset 20     ...       {"layout": {...}, "epoch": "<hex>"}
    offset 4096   ...       the pool's tensors (kv_cache.py lays them out)

A restarted worker with the same name opens the same file: when its layout (model, weights, dtypes,
block size, shape) is the one this worker would build, the pool *continues*: same bytes, same
`epoch`, which the block manager checks before it keeps the pool's tables. A segment whose layout
differs is never trusted: it is emptied and set up afresh with a new epoch, and the log says why.

Restart or duplicate is told by an flock on the file, held for the worker's whole life and released
by the kernel when it dies, however it dies: a worker that finds it taken is a second live process
with a held name, and is refused with the holder's pid. Never by timing.

The supervisor removes the folder when the deployment stops, and a sweeper process removes it when
the supervisor itself is killed (ops/deploy/kv_segments.py), so no segment outlives its deployment.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import secrets
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAGIC = b"PGSKV\x00\x00\x01"
HEADER_BYTES = 4096
_FIXED = struct.Struct("<8sQI")  # magic, holder pid, JSON length


class NameHeld(RuntimeError):
    """Another live process holds this worker name's segment."""


@dataclass(slots=True)
class KVSegment:
    path: Path
    fd: int
    memory: mmap.mmap
    epoch: str
    num_blocks: int
    continued: bool  # the bytes of a previous worker of this name, its layout proven
    discarded: str | None = None  # why a previous segment was not trusted, if there was one
    layout: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(
        cls,
        folder: str | Path,
        worker_id: str,
        layout: dict[str, Any],
        num_blocks: int,
        pool_bytes: Any,  # (num_blocks) -> bytes the pool's tensors take
        adopt_num_blocks: bool,
        locked: tuple[Path, int] | None = None,
    ) -> KVSegment:
        """Lock and map this worker's segment, continuing it when its layout proves the same.

        `adopt_num_blocks`: the pool was sized from the machine (auto), so a segment of another
        block count is still this worker's pool (the machine's free memory moved, not the config).
        `locked`: what `lock_name` returned, when the name was taken before the model was loaded."""
        path, fd = lock_name(folder, worker_id) if locked is None else locked
        try:
            old = read_header(fd)
            discarded = None
            if old is not None:
                mine, theirs = dict(layout), dict(old["layout"])
                if adopt_num_blocks:
                    mine.pop("num_blocks", None)
                    found_blocks = int(theirs.pop("num_blocks", 0))
                else:
                    found_blocks = num_blocks
                size = HEADER_BYTES + pool_bytes(found_blocks) if found_blocks > 0 else -1
                if mine == theirs and found_blocks > 0 and os.fstat(fd).st_size == size:
                    _stamp_pid(fd)
                    memory = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                    full = dict(layout, num_blocks=found_blocks)
                    return cls(path, fd, memory, str(old["epoch"]), found_blocks, True, None, full)
                discarded = mismatch(mine, theirs) or f"size {os.fstat(fd).st_size} != {size}"
            elif os.fstat(fd).st_size:
                discarded = "no complete header (set up by a worker killed before it finished)"
            return cls._fresh(path, fd, layout, num_blocks, HEADER_BYTES + pool_bytes(num_blocks), discarded)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _fresh(
        cls, path: Path, fd: int, layout: dict[str, Any], num_blocks: int, size: int, discarded: str | None
    ) -> KVSegment:
        # Truncating to 0 first drops every old page: the new pool reads as zeros, and tmpfs gives
        # the memory back now, not when the bytes are next written.
        os.ftruncate(fd, 0)
        os.ftruncate(fd, size)
        epoch = secrets.token_hex(8)
        full = dict(layout, num_blocks=num_blocks)
        body = json.dumps({"layout": full, "epoch": epoch}, sort_keys=True).encode()
        if _FIXED.size + len(body) > HEADER_BYTES:
            raise ValueError(f"KV segment layout too long for its header ({len(body)} bytes)")
        os.pwrite(fd, _FIXED.pack(b"\x00" * 8, os.getpid(), len(body)) + body, 0)
        os.fsync(fd)  # no-op on tmpfs; on another file system the magic must not land before the body
        os.pwrite(fd, MAGIC, 0)  # last: a header without it is never trusted
        memory = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return cls(path, fd, memory, epoch, num_blocks, False, discarded, full)

    def close(self) -> None:
        """Unmap and unlock; the file stays for the next worker of this name (the supervisor removes it).
        Views of the mapping must be gone first, or the mapping stays until they are."""
        with contextlib.suppress(BufferError):
            self.memory.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def lock_name(folder: str | Path, worker_id: str) -> tuple[Path, int]:
    """Open and lock this worker name's segment file -> (path, fd); NameHeld if a live process has it.
    Taken first thing at start, so a duplicate is refused at once, before it loads a model."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"kv_segment_dir {str(folder)!r} is not a folder: the supervisor creates it for its deployment"
        )
    path = folder / f"{safe_name(worker_id)}.kv"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = lock_holder(fd)
        os.close(fd)
        raise NameHeld(
            f"worker name {worker_id!r} is held by a live process (pid {holder if holder else 'unknown'}) "
            f"that locks its KV segment {path}: two workers may not share one name and pool"
        ) from None
    return path, fd


def safe_name(worker_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in worker_id) or "_"


def read_header(fd: int) -> dict[str, Any] | None:
    raw = os.pread(fd, HEADER_BYTES, 0)
    if len(raw) < _FIXED.size:
        return None
    magic, _pid, length = _FIXED.unpack_from(raw)
    if magic != MAGIC or _FIXED.size + length > len(raw):
        return None
    try:
        header = json.loads(raw[_FIXED.size : _FIXED.size + length])
    except ValueError:
        return None
    if not isinstance(header, dict) or not isinstance(header.get("layout"), dict) or "epoch" not in header:
        return None
    return header


def mismatch(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    """What differs, for the log line: `dtype float32 != bfloat16, block_size 16 != 32`."""
    keys = sorted(set(mine) | set(theirs))
    return ", ".join(
        f"{k} {theirs.get(k)!r} != {mine.get(k)!r}" for k in keys if mine.get(k) != theirs.get(k)
    )


def lock_holder(fd: int) -> int | None:
    """The pid holding an flock on this file, from /proc/locks (else the header's note of it)."""
    st = os.fstat(fd)
    with contextlib.suppress(OSError):
        for line in Path("/proc/locks").read_text().splitlines():
            parts = line.split()
            # "1: FLOCK  ADVISORY  WRITE 12345 00:2d:67890 0 EOF"
            if len(parts) >= 6 and parts[1] == "FLOCK":
                major, minor, inode = parts[5].split(":")
                if (int(major, 16), int(minor, 16), int(inode)) == (
                    os.major(st.st_dev),
                    os.minor(st.st_dev),
                    st.st_ino,
                ):
                    return int(parts[4])
    raw = os.pread(fd, _FIXED.size, 0)
    if len(raw) == _FIXED.size:
        pid = _FIXED.unpack(raw)[1]
        return pid or None
    return None


def _stamp_pid(fd: int) -> None:
    os.pwrite(fd, struct.pack("<Q", os.getpid()), 8)
