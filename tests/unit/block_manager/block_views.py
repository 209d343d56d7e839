"""The block-manager tests' small pool, and views of its blocks read from the public health dump.

(A plain module rather than conftest.py: test modules import it by name, and several conftest.py
files without packages would shadow each other.)"""

from __future__ import annotations

from pagedserve.services.block_manager.manager import BlockManager

BLOCK_SIZE = 4
NUM_BLOCKS = 16
TTL = 10.0


def ref_counts(manager: BlockManager, pool_id: str = "w0") -> dict[int, int]:
    """Block id -> ref count, read from the health dump (the public view)."""
    pool = next(p for p in manager.snapshot(0.0)["pools"] if p["worker_id"] == pool_id)
    return {b["id"]: b["ref_count"] for b in pool["blocks"]}


def cached_ids(manager: BlockManager, pool_id: str = "w0") -> set[int]:
    pool = next(p for p in manager.snapshot(0.0)["pools"] if p["worker_id"] == pool_id)
    return {b["id"] for b in pool["blocks"] if b["hash"] is not None}


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))
