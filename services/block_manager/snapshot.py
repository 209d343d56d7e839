"""The health dump served by `GET /blocks`, and the invariants it checks.

Built by scanning everything, so it is O(blocks + table entries): for the ops endpoint and
tests, never for the per-step path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagedserve.services.block_manager.leases import LeaseTable
from pagedserve.services.block_manager.pool import BlockPool, block_hash
from pagedserve.services.block_manager.table import BlockTable
from pagedserve.shared.paging import blocks_for


def snapshot(
    pools: Mapping[str, BlockPool], tables: Mapping[str, BlockTable], leases: LeaseTable, now: float
) -> dict[str, Any]:
    owners: dict[int, dict[int, list[BlockTable]]] = {id(p): {} for p in pools.values()}
    for table in tables.values():
        holders = owners.setdefault(id(table.pool), {})
        for block_id in table.block_ids:
            holders.setdefault(block_id, []).append(table)

    pool_dumps = []
    grand = _zero_totals()
    for pool_id, pool in pools.items():
        holders = owners[id(pool)]
        totals = _zero_totals()
        blocks = []
        for block in pool.blocks:
            held_by = holders.get(block.id, [])
            expiries = [t.lease.expires_at - now for t in held_by]
            blocks.append(
                {
                    "id": block.id,
                    "ref_count": block.ref_count,
                    "owners": [t.request_id for t in held_by],
                    "hash": None if block.cache_key is None else block_hash(block.cache_key),
                    # A cached block whose write its owner has not confirmed: a hit for it alone.
                    "pending_owner": block.pending,
                    "lease_expires_in_s": min(expiries) if expiries else None,
                }
            )
            totals["total"] += 1
            if block.ref_count == 0:
                totals["free"] += 1
            else:
                totals["used"] += 1
                # Leaked: referenced, yet no live lease keeps it (the reaper is behind or broken).
                if not any(e > 0 for e in expiries):
                    totals["leaked"] += 1
            if block.cache_key is not None:
                totals["cached"] += 1
        for key, value in totals.items():
            grand[key] += value
        pool_dumps.append(
            {
                "worker_id": pool_id,
                "num_blocks": pool.num_blocks,
                "block_size": pool.block_size,
                "blocks": blocks,
                "totals": totals,
            }
        )

    lease_dumps = [
        {
            "request_id": t.request_id,
            "owner": t.lease.owner,
            "pool_id": t.pool.pool_id,
            "expires_in_s": t.lease.expires_at - now,
            "num_blocks": len(t.block_ids),
        }
        for t in tables.values()
    ]
    problems = violations(pools, tables, leases)
    return {
        "pools": pool_dumps,
        "leases": lease_dumps,
        "totals": grand,
        "invariants": {"ok": not problems, "violations": problems},
    }


def violations(
    pools: Mapping[str, BlockPool], tables: Mapping[str, BlockTable], leases: LeaseTable | None = None
) -> list[str]:
    """Every broken invariant, in words; [] when healthy."""
    problems: list[str] = []
    refs: dict[int, dict[int, int]] = {id(p): {} for p in pools.values()}
    for rid, table in tables.items():
        pool = pools.get(table.pool.pool_id)
        if pool is None or pool is not table.pool:
            problems.append(f"table {rid!r} points at pool {table.pool.pool_id!r}, which is not registered")
            continue
        expected_blocks = blocks_for(table.num_slots, pool.block_size)
        if len(table.block_ids) != expected_blocks:
            problems.append(
                f"table {rid!r} has {len(table.block_ids)} blocks for {table.num_slots} slots "
                f"(block size {pool.block_size}: expected {expected_blocks})"
            )
        if table.capacity != len(table.block_ids) * pool.block_size:
            problems.append(f"table {rid!r}: capacity {table.capacity} != blocks x block size")
        if not table.num_slots <= table.write_limit <= table.capacity:
            problems.append(f"table {rid!r}: write limit {table.write_limit} outside its slots and capacity")
        counts = refs[id(pool)]
        for block_id in table.block_ids:
            if not 0 <= block_id < pool.num_blocks:
                problems.append(f"table {rid!r} holds block {block_id}, outside pool {pool.pool_id!r}")
            counts[block_id] = counts.get(block_id, 0) + 1
        if leases is not None and leases.get(rid) is not table.lease:
            problems.append(f"table {rid!r} has no lease in the lease table")
    if leases is not None:
        for lease in leases:
            if lease.request_id not in tables:
                problems.append(f"lease of {lease.request_id!r} holds no block table")

    for pool_id, pool in pools.items():
        counts = refs[id(pool)]
        free = len(pool.free)
        used = sum(1 for b in pool.blocks if b.ref_count > 0)
        zero = sum(1 for b in pool.blocks if b.ref_count == 0)
        if free + used != pool.num_blocks:
            problems.append(f"pool {pool_id!r}: free {free} + used {used} != total {pool.num_blocks}")
        if free != zero:
            problems.append(f"pool {pool_id!r}: free list holds {free} blocks but {zero} have ref_count 0")
        for block in pool.blocks:
            held = counts.get(block.id, 0)
            if block.ref_count != held:
                problems.append(
                    f"pool {pool_id!r} block {block.id}: ref_count {block.ref_count} but {held} table entries"
                )
            if block.ref_count > 0 and block.id in pool.free:
                problems.append(
                    f"pool {pool_id!r} block {block.id}: in the free list with ref_count {block.ref_count}"
                )
            if block.pending is not None and block.cache_key is None:
                problems.append(
                    f"pool {pool_id!r} block {block.id}: pending on {block.pending!r} but not cached"
                )
        for key, block in pool.cached.items():
            if block.cache_key != key:
                problems.append(f"pool {pool_id!r} block {block.id}: cached under a key it does not hold")
        num_keyed = sum(1 for b in pool.blocks if b.cache_key is not None)
        if num_keyed != len(pool.cached):
            problems.append(
                f"pool {pool_id!r}: {num_keyed} blocks hold a hash but the cache maps {len(pool.cached)}"
            )
    return problems


def _zero_totals() -> dict[str, int]:
    return {"total": 0, "free": 0, "used": 0, "cached": 0, "leaked": 0}
