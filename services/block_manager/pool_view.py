"""The pool as the live web view draws it: one state byte per block, plus one block's details.

`/blocks` (snapshot.py) builds a dict per block and checks every invariant in Python: 2 s and
0.2 s for a 100,000-block pool, far too slow to hold the lock for once a second. Here the lock
is held only for one sweep that copies the pool and the tables into plain lists (`gather`); the
per-block work is then a few numpy passes over them (`encode`), outside the lock, and the
invariants the view shows are the same ones checked on those arrays (refs == table entries,
the free list == the blocks with no ref, free + used == total, leases <-> tables; the cache map's
keys are checked by /blocks only).
Block ids index the byte string directly, so the page needs nothing else to colour a cell.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from pagedserve.services.block_manager.leases import LeaseTable
from pagedserve.services.block_manager.pool import BlockPool, block_hash
from pagedserve.services.block_manager.table import BlockTable

# One byte per block, in the order of precedence (a later state wins over an earlier one).
FREE = 0  # no ref, no cached content
FREE_CACHED = 1  # no ref, but still holds a cached prefix a later prompt may hit
HELD = 2  # one ref
CACHED = 3  # one ref, its content in the prefix cache (confirmed written)
SHARED = 4  # more than one ref: a prefix hit or a fork
PENDING = 5  # cached under a key its owner has not confirmed written (a hit for that owner only)
EXPIRING = 6  # held, and its lease has under half its ttl left: the owner stopped renewing
LEAKED = 7  # held, and no live lease keeps it (the reaper is behind, or broken)
BROKEN = 8  # an invariant fails on this block (its refs, the free list, the cache map)
STATES = ("free", "free_cached", "held", "cached", "shared", "pending", "expiring", "leaked", "broken")


@dataclass(slots=True)
class PoolLists:
    """One pool's raw facts as plain lists, copied under the lock; the encoding works on these."""

    pool_id: str
    num_blocks: int
    block_size: int
    refs: list[int]  # ref count by block id
    held: list[int]  # every table entry's block id, table after table
    lengths: list[int]  # entries per table
    expiry: list[float]  # lease expiry per table
    free: list[int]  # the free list's ids
    cached: list[int]  # ids of blocks with a cache key
    pending: list[int]  # ids of cached blocks whose key is unconfirmed


@dataclass(slots=True)
class Gathered:
    now: float
    ttl_s: float
    num_requests: int
    pools: list[PoolLists]
    problems: list[str]  # found while gathering: tables and leases that do not match


def gather(
    pools: Mapping[str, BlockPool], tables: Mapping[str, BlockTable], leases: LeaseTable, now: float
) -> Gathered:
    """Everything the encoding needs, as lists: the only part that must hold the lock (about a
    third of the work; numpy does the rest outside it)."""
    by_pool: dict[str, list[BlockTable]] = {pid: [] for pid in pools}
    problems: list[str] = []
    for rid, table in tables.items():
        if pools.get(table.pool.pool_id) is not table.pool:
            problems.append(f"table {rid!r} points at pool {table.pool.pool_id!r}, which is not registered")
            continue
        by_pool[table.pool.pool_id].append(table)
        if leases.get(rid) is not table.lease:
            problems.append(f"table {rid!r} has no lease in the lease table")
    problems += [
        f"lease of {lease.request_id!r} holds no block table"
        for lease in leases
        if lease.request_id not in tables
    ]
    gathered = []
    for pool_id, pool in pools.items():
        held_by = by_pool[pool_id]
        cached = list(pool.cached.values())
        gathered.append(
            PoolLists(
                pool_id,
                pool.num_blocks,
                pool.block_size,
                [b.ref_count for b in pool.blocks],
                list(chain.from_iterable([t.block_ids for t in held_by])),
                [len(t.block_ids) for t in held_by],
                [t.lease.expires_at for t in held_by],
                list(pool.free),
                [b.id for b in cached],
                [b.id for b in cached if b.pending is not None],
            )
        )
    return Gathered(now, leases.ttl_s, len(tables), gathered, problems)


def encode(gathered: Gathered) -> dict[str, Any]:
    """Every pool's states as base64 bytes, per-pool counts by state, and the invariants verdict."""
    problems = list(gathered.problems)
    out = []
    grand: dict[str, int] = dict.fromkeys(STATES, 0)
    for pool in gathered.pools:
        codes, pool_problems = _pool_states(pool, gathered.now, gathered.ttl_s)
        problems += pool_problems
        counts = np.bincount(codes, minlength=len(STATES))
        by_state = {name: int(counts[i]) for i, name in enumerate(STATES)}
        for name, count in by_state.items():
            grand[name] += count
        out.append(
            {
                "worker_id": pool.pool_id,
                "num_blocks": pool.num_blocks,
                "block_size": pool.block_size,
                "free": len(pool.free),
                "cached": len(pool.cached),
                "states": base64.b64encode(codes.tobytes()).decode(),
                "by_state": by_state,
            }
        )
    return {
        "states": list(STATES),
        "pools": out,
        "by_state": grand,
        "requests": gathered.num_requests,
        "invariants": {"ok": not problems, "count": len(problems), "violations": problems[:20]},
    }


def _ints(values: list[int]) -> np.ndarray:
    # np.fromiter over a list with a known count: 3x faster than over a generator or a map here,
    # and np.array over a list or per-element stores cost more still.
    return np.fromiter(values, np.int64, len(values))


def _pool_states(pool: PoolLists, now: float, ttl_s: float) -> tuple[np.ndarray, list[str]]:
    n = pool.num_blocks
    problems: list[str] = []
    refs = _ints(pool.refs)
    held = _ints(pool.held)
    expiry = np.repeat(np.fromiter(pool.expiry, np.float64, len(pool.expiry)), pool.lengths)
    outside = (held < 0) | (held >= n)
    if outside.any():
        problems.append(f"pool {pool.pool_id!r}: tables hold {int(outside.sum())} block ids outside the pool")
        held, expiry = held[~outside], expiry[~outside]
    entries = np.bincount(held, minlength=n)
    latest = np.full(n, -np.inf)  # the longest-lived lease among a block's holders
    np.maximum.at(latest, held, expiry)
    in_free = np.zeros(n, bool)
    in_free[_ints(pool.free)] = True
    keyed = np.zeros(n, bool)
    keyed[_ints(pool.cached)] = True
    pending = np.zeros(n, bool)
    pending[_ints(pool.pending)] = True

    codes = np.where(keyed, FREE_CACHED, FREE).astype(np.uint8)
    codes[refs == 1] = HELD
    codes[(refs == 1) & keyed] = CACHED
    codes[refs > 1] = SHARED
    used = refs > 0
    codes[used & pending] = PENDING
    codes[used & (latest > now) & (latest - now < ttl_s / 2)] = EXPIRING
    codes[used & (latest <= now)] = LEAKED
    broken = (refs != entries) | (in_free == used)
    codes[broken] = BROKEN
    if broken.any():
        first = np.flatnonzero(broken)[:5].tolist()
        problems.append(
            f"pool {pool.pool_id!r}: {int(broken.sum())} blocks whose ref count disagrees with the "
            f"tables or the free list (first: {first})"
        )
    if len(pool.free) + int(used.sum()) != n:
        problems.append(f"pool {pool.pool_id!r}: free {len(pool.free)} + used {int(used.sum())} != total {n}")
    return codes, problems


def block_detail(
    pools: Mapping[str, BlockPool], tables: Mapping[str, BlockTable], pool_id: str, block_id: int, now: float
) -> dict[str, Any] | None:
    """What a hover shows: refs, owners (with their lease and age), hash, pending owner. None for
    an unknown pool or id. A scan of the tables: one block, on demand, never per update."""
    pool = pools.get(pool_id)
    if pool is None or not 0 <= block_id < pool.num_blocks:
        return None
    block = pool.blocks[block_id]
    holders = [t for t in tables.values() if t.pool is pool and block_id in t.block_ids]
    return {
        "worker_id": pool_id,
        "id": block_id,
        "ref_count": block.ref_count,
        "in_free_list": block_id in pool.free,
        "hash": None if block.cache_key is None else block_hash(block.cache_key),
        "pending_owner": block.pending,
        "owners": [
            {
                "request_id": t.request_id,
                "lease_owner": t.lease.owner,
                "lease_expires_in_s": round(t.lease.expires_at - now, 3),
                "held_for_s": round(now - t.allocated_at, 3),
                "logical_index": t.block_ids.index(block_id),
                "num_blocks": len(t.block_ids),
            }
            for t in holders
        ],
    }


def request_blocks(tables: Mapping[str, BlockTable], request_id: str) -> dict[str, Any] | None:
    table = tables.get(request_id)
    if table is None:
        return None
    return {"request_id": request_id, "worker_id": table.pool.pool_id, "block_ids": table.block_ids.copy()}
