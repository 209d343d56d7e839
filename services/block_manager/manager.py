"""The block manager core: block tables of requests over the pools of workers, with leases.

Pure: no sockets, no threads, no logging. Every method that needs the clock takes `now`
(seconds), so tests drive time by hand. Any op on a request (allocate, grow, fork)
renews its lease; a failed op (None) changes nothing at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pagedserve.services.block_manager import pool_view
from pagedserve.services.block_manager import snapshot as health
from pagedserve.services.block_manager.block_ops import apply_ops
from pagedserve.services.block_manager.leases import LeaseTable
from pagedserve.services.block_manager.pool import NO_PREFIX, Block, BlockPool
from pagedserve.services.block_manager.table import NEVER, BlockTable
from pagedserve.shared.protocol.blocks import UNCHANGED, Allocation, BlockAnswers, BlockOp, Growth

__all__ = [
    "Allocation",
    "BlockManager",
    "BlockManagerError",
    "Growth",
    "Reclaimed",
    "UnknownPoolError",
    "UnknownRequestError",
]


class BlockManagerError(ValueError):
    """A call the block manager refuses: the message names the argument and why."""


class UnknownPoolError(BlockManagerError):
    pass


class UnknownRequestError(BlockManagerError):
    pass


@dataclass(slots=True)
class Reclaimed:
    """A request whose lease lapsed and whose blocks the reaper took back."""

    request_id: str
    owner: str
    pool_id: str
    num_blocks: int  # blocks whose ref count hit 0


class BlockManager:
    def __init__(self, lease_ttl_s: float = 10.0, enable_prefix_caching: bool = True) -> None:
        self.enable_prefix_caching = enable_prefix_caching
        self._leases = LeaseTable(lease_ttl_s)
        self._ttl = lease_ttl_s
        self._pools: dict[str, BlockPool] = {}
        self._tables: dict[str, BlockTable] = {}

    # ------------------------------------------------------------ pools

    def add_pool(self, pool_id: str, num_blocks: int, block_size: int) -> None:
        """Register a worker's pool. A pool id seen before is a restarted worker: its old
        tables are dropped, since the KV they point at is gone."""
        if type(num_blocks) is not int or num_blocks < 1:
            raise BlockManagerError(f"num_blocks must be a positive int, got {num_blocks!r}")
        if type(block_size) is not int or block_size < 1:
            raise BlockManagerError(f"block_size must be a positive int, got {block_size!r}")
        self.remove_pool(pool_id)
        self._pools[pool_id] = BlockPool(pool_id, num_blocks, block_size)

    def remove_pool(self, pool_id: str) -> list[str]:
        """Worker lost: drop every table and lease of its pool; returns those request ids."""
        pool = self._pools.pop(pool_id, None)
        if pool is None:
            return []
        dropped = [rid for rid, table in self._tables.items() if table.pool is pool]
        for rid in dropped:
            del self._tables[rid]
            self._leases.remove(rid)
        return dropped

    def requests_of(self, pool_id: str) -> list[str]:
        """Ids of the tables in this pool."""
        pool = self._pools.get(pool_id)
        return [rid for rid, table in self._tables.items() if table.pool is pool]

    def has_pool(self, pool_id: str) -> bool:
        return pool_id in self._pools

    def pools(self) -> dict[str, tuple[int, int]]:
        return {pid: (p.num_blocks, p.block_size) for pid, p in self._pools.items()}

    def num_free_blocks(self, pool_id: str) -> int:
        return len(self._pool(pool_id).free)

    def num_cached_blocks(self) -> int:
        return sum(len(p.cached) for p in self._pools.values())

    def free_blocks(self) -> dict[str, int]:
        """Free block count of every pool (the batch reply carries it)."""
        return {pid: len(p.free) for pid, p in self._pools.items()}

    # ------------------------------------------------------------ requests

    def allocate(
        self,
        pool_id: str,
        request_id: str,
        owner: str,
        token_ids: Sequence[int],
        max_new_tokens: int,
        now: float,
        use_prefix_cache: bool = True,
        cache_namespace: str | None = None,
    ) -> Allocation | None:
        """A new block table: leading prefix-cache hits, then fresh blocks for `max_new_tokens`
        slots at most. None (and nothing changed) when the pool has too few free blocks.
        `use_prefix_cache` false: no hits (every slot computed); its blocks are still cached later.
        `cache_namespace`: the request's LoRA adapter; its blocks hit and are hit only within it."""
        if request_id in self._tables:
            raise BlockManagerError(f"request {request_id!r} already has a block table")
        pool = self._pool(pool_id)
        num_tokens = len(token_ids)
        if num_tokens == 0:
            raise BlockManagerError(f"request {request_id!r}: token_ids must not be empty")
        if max_new_tokens < 0:
            raise BlockManagerError(
                f"request {request_id!r}: max_new_tokens must be >= 0, got {max_new_tokens}"
            )
        bs = pool.block_size
        hits: list[Block] = []
        prefix = pool.root_prefix(cache_namespace)
        if self.enable_prefix_caching and use_prefix_cache:
            cached = pool.cached
            # Never the whole prompt: the last prompt token must be computed to give the logits.
            visible = pool.visible
            for start in range(0, (num_tokens - 1) // bs * bs, bs):
                block = cached.get((prefix, tuple(token_ids[start : start + bs])))
                if block is None or not visible(block, owner):
                    break
                hits.append(block)
                prefix = block.prefix_id
        num_cached = len(hits) * bs
        num_new = min(max_new_tokens, num_tokens - num_cached)
        num_fresh = (num_cached + num_new + bs - 1) // bs - len(hits)
        free = pool.free
        revived = sum(1 for b in hits if b.ref_count == 0)  # hits still in the free list
        if num_fresh > len(free) - revived:
            return None
        # Hits leave the free list before fresh blocks are taken, so these are never evicted.
        for block in hits:
            pool.share(block)
        block_ids = [b.id for b in hits]
        take_free = pool.take_free
        for _ in range(num_fresh):
            block_ids.append(take_free().id)
        table = BlockTable(
            request_id,
            pool,
            self._leases.grant(owner, request_id, now),
            block_ids,
            num_cached + num_new,
            len(block_ids) * bs,
            len(block_ids) * bs,
            list(token_ids),
            len(hits),
            prefix,
            (len(hits) + 1) * bs if self.enable_prefix_caching else NEVER,
            now,
        )
        self._tables[request_id] = table
        if table.next_cache_at <= num_cached + num_new and table.next_cache_at <= num_tokens:
            _cache_full_blocks(table)
        return Allocation(block_ids.copy(), num_cached, num_new)

    def grow(
        self, request_id: str, num_new_tokens: int, new_token_ids: Sequence[int], now: float
    ) -> Growth | None:
        """Give the request `num_new_tokens` more slots and append the tokens that became
        known. A write into a shared block copies it first. None (nothing changed, the lease
        neither) when the pool has too few free blocks."""
        try:
            table = self._tables[request_id]
        except KeyError:
            raise UnknownRequestError(f"unknown request {request_id!r}") from None
        if num_new_tokens < 0:
            raise BlockManagerError(
                f"request {request_id!r}: num_new_tokens must be >= 0, got {num_new_tokens}"
            )
        end = table.num_slots + num_new_tokens
        if end <= table.write_limit:
            # The common decode step (15 of 16): the slots fit in the last block, which is known
            # to be this table's alone. A few attribute stores: this runs per request per step.
            table.num_slots = end
            if new_token_ids:
                table.token_ids.extend(new_token_ids)
            table.lease.expires_at = now + self._ttl
            if end >= table.next_cache_at and len(table.token_ids) >= table.next_cache_at:
                _cache_full_blocks(table)
            return UNCHANGED
        return self._grow_blocks(table, end, new_token_ids, now)

    def _grow_blocks(
        self, table: BlockTable, end: int, new_token_ids: Sequence[int], now: float
    ) -> Growth | None:
        """grow past the write limit: fresh blocks, or a copy-on-write of the shared last block."""
        pool = table.pool
        bs = pool.block_size
        block_ids = table.block_ids
        capacity = table.capacity
        if table.write_limit == capacity and end <= capacity + bs:
            # A decode crossing into the next block: exactly one fresh block, no copy.
            if not pool.free:
                return None
            block_id = pool.take_free().id
            block_ids.append(block_id)
            growth = Growth((block_id,), (), ())
        else:
            growth = self._grow_general(pool, block_ids, table.num_slots, end)
            if growth is None:
                return None
        # From here on the last block is this table's alone (fresh, copied, or found unshared).
        table.capacity = table.write_limit = len(block_ids) * bs
        table.num_slots = end
        if new_token_ids:
            table.token_ids.extend(new_token_ids)
        table.lease.expires_at = now + self._ttl
        if end >= table.next_cache_at and len(table.token_ids) >= table.next_cache_at:
            _cache_full_blocks(table)
        return growth

    @staticmethod
    def _grow_general(pool: BlockPool, block_ids: list[int], num_slots: int, end: int) -> Growth | None:
        """Any number of fresh blocks, after a copy-on-write of the last block when it is shared
        and partly filled. Changes block_ids in place; None (nothing changed) when short of blocks."""
        bs = pool.block_size
        num_fresh = (end + bs - 1) // bs - len(block_ids)
        # Writing in place into a partly filled last block that another table reads (after a
        # fork) would corrupt that table's KV: it is copied first.
        copy_tail = num_slots % bs != 0 and end > num_slots and pool.blocks[block_ids[-1]].ref_count > 1
        if not (num_fresh or copy_tail):
            return UNCHANGED
        if num_fresh + copy_tail > len(pool.free):
            return None
        replaced: tuple[tuple[int, int], ...] = ()
        copies: tuple[tuple[int, int], ...] = ()
        if copy_tail:
            src = pool.blocks[block_ids[-1]]
            dst = pool.take_free()
            pool.release(src)  # others still hold it: never the last reference
            block_ids[-1] = dst.id
            replaced = ((len(block_ids) - 1, dst.id),)
            copies = ((src.id, dst.id),)
        take_free = pool.take_free
        new_block_ids = tuple([take_free().id for _ in range(num_fresh)])
        block_ids.extend(new_block_ids)
        return Growth(new_block_ids, replaced, copies)

    def resume(
        self, request_id: str, num_slots: int, num_new_tokens: int, new_token_ids: Sequence[int], now: float
    ) -> Growth | None:
        """The table's worker died and came back with this pool (a shared-memory segment): its slots
        past `num_slots`, the ones its owner saw committed, may never have been written (the steps
        that computed them died), so they are given again, and keys over blocks not wholly within
        `num_slots` that this table's owner still had pending leave the cache; blocks past the grow that
        follows go back to the pool (later replayed steps take fresh ones). Then `grow`."""
        table = self._tables.get(request_id)
        if table is None:
            raise UnknownRequestError(f"unknown request {request_id!r}")
        # Up to the blocks it holds: the scheduler sends no grow for a step that fits them.
        if num_slots > table.capacity:
            raise BlockManagerError(
                f"request {request_id!r}: cannot resume at {num_slots} slots, its blocks hold {table.capacity}"
            )
        pool = table.pool
        owner = table.lease.owner
        for index in range(num_slots // pool.block_size, table.num_hashed_blocks):
            block = pool.blocks[table.block_ids[index]]
            if block.cache_key is not None and block.pending == owner:
                pool.uncache(block)
        _cut_to(table, num_slots, num_slots + num_new_tokens)
        return self.grow(request_id, num_new_tokens, new_token_ids, now)

    def fork(self, parent_id: str, child_id: str, owner: str, now: float) -> bool:
        """The child shares every block of the parent (copy-on-write on the first write into
        the shared partly filled block), with the same slots and known tokens. Slots already
        given count as written: fork once the parent's given slots are computed (the scheduler
        forks at the step that completes the prompt), or both would write the same slots."""
        parent = self._tables.get(parent_id)
        if parent is None:
            raise UnknownRequestError(f"unknown request {parent_id!r} (fork parent)")
        if child_id in self._tables:
            raise BlockManagerError(f"request {child_id!r} already has a block table (fork child)")
        pool = parent.pool
        blocks = pool.blocks
        for block_id in parent.block_ids:
            blocks[block_id].ref_count += 1  # held by the parent, so never in the free list
        parent.lease.expires_at = now + self._ttl
        # Both now share the last block: their next write goes through the copy-on-write check.
        parent.write_limit = parent.num_slots
        self._tables[child_id] = BlockTable(
            child_id,
            pool,
            self._leases.grant(owner, child_id, now),
            parent.block_ids.copy(),
            parent.num_slots,
            parent.capacity,
            parent.num_slots,
            parent.token_ids.copy(),
            parent.num_hashed_blocks,
            parent.prefix_id,
            parent.next_cache_at,
            now,
        )
        return True

    def free(self, request_id: str, num_computed: int | None = None) -> int:
        """Drop the table and its lease; returns how many blocks became free. Idempotent.

        `num_computed`: how many of its slots the owner saw computed (None: all of them). Pending
        keys within them are confirmed for every owner; those past them leave the cache."""
        table = self._tables.pop(request_id, None)
        if table is None:
            return 0
        self._leases.remove(request_id)
        _settle(table, table.num_slots if num_computed is None else num_computed)
        return _release(table)

    def renew_owner(self, owner: str, now: float) -> int:
        return self._leases.renew_owner(owner, now)

    def reap_expired(self, now: float) -> list[Reclaimed]:
        """Free every request whose lease lapsed (owner crashed, or a path that never freed)."""
        reclaimed = []
        for lease in self._leases.expired(now):
            table = self._tables.pop(lease.request_id)
            self._leases.remove(lease.request_id)
            _settle(table, 0)  # its owner is gone: nothing it keyed was ever confirmed written
            reclaimed.append(Reclaimed(lease.request_id, lease.owner, table.pool.pool_id, _release(table)))
        return reclaimed

    def table(self, request_id: str) -> list[int] | None:
        table = self._tables.get(request_id)
        return None if table is None else table.block_ids.copy()

    def num_requests(self) -> int:
        return len(self._tables)

    # ------------------------------------------------------------ health and the batched RPC

    def snapshot(self, now: float) -> dict[str, Any]:
        return health.snapshot(self._pools, self._tables, self._leases, now)

    def pool_view(self, now: float) -> dict[str, Any]:
        """The live view's compact form of every pool (pool_view.py): a byte per block."""
        return pool_view.encode(self.pool_view_lists(now))

    def pool_view_lists(self, now: float) -> pool_view.Gathered:
        """What pool_view encodes, copied as lists: the part that needs the lock."""
        return pool_view.gather(self._pools, self._tables, self._leases, now)

    def block_detail(self, pool_id: str, block_id: int, now: float) -> dict[str, Any] | None:
        return pool_view.block_detail(self._pools, self._tables, pool_id, block_id, now)

    def request_blocks(self, request_id: str) -> dict[str, Any] | None:
        return pool_view.request_blocks(self._tables, request_id)

    def check_invariants(self) -> list[str]:
        return health.violations(self._pools, self._tables, self._leases)

    def apply(self, ops: Sequence[BlockOp], now: float) -> BlockAnswers:
        return apply_ops(self, ops, now)

    def _pool(self, pool_id: str) -> BlockPool:
        pool = self._pools.get(pool_id)
        if pool is None:
            raise UnknownPoolError(f"unknown pool {pool_id!r}")
        return pool


def _release(table: BlockTable) -> int:
    """Drop the table's references; returns how many blocks became free."""
    pool = table.pool
    blocks = pool.blocks
    release = pool.release
    freed = 0
    # Last block first: the free list hands out the least recently freed block first, so a
    # prefix's tail is evicted before its head, and the head is what later prompts can hit.
    for block_id in reversed(table.block_ids):
        if release(blocks[block_id]):
            freed += 1
    return freed


def _settle(table: BlockTable, num_computed: int) -> None:
    """The table's owner is done with it: its pending keys over computed blocks are confirmed,
    the rest (KV that may never have been written) leave the cache."""
    pool = table.pool
    blocks = pool.blocks
    owner = table.lease.owner
    num_full = num_computed // pool.block_size
    for index in range(table.num_hashed_blocks):
        block = blocks[table.block_ids[index]]
        if block.pending is None or block.pending != owner:
            continue  # confirmed already, or another owner's to settle
        if index < num_full:
            block.pending = None
        else:
            pool.uncache(block)


def _cut_to(table: BlockTable, num_slots: int, next_slots: int) -> None:
    """Take the table back to `num_slots`, keeping the blocks the grow to `next_slots` that follows
    will fill; those past them go back to the pool, so that a table always holds exactly the blocks of
    its slots. Hashing stops if it had gone past the cut: the chain's content id there is not known
    any more."""
    pool = table.pool
    bs = pool.block_size
    keep = min(len(table.block_ids), (next_slots + bs - 1) // bs)
    for block_id in reversed(table.block_ids[keep:]):  # last first, as a free does
        pool.release(pool.blocks[block_id])
    del table.block_ids[keep:]
    if table.num_hashed_blocks > keep:
        table.num_hashed_blocks, table.prefix_id, table.next_cache_at = keep, NO_PREFIX, NEVER
    table.num_slots = num_slots
    table.capacity = keep * bs
    # The next write checks its block afresh (a fork may share the last one kept): the slow path.
    table.write_limit = num_slots


def _cache_full_blocks(table: BlockTable) -> None:
    """Offer the prefix cache every block whose slots and known tokens are now both complete."""
    token_ids = table.token_ids
    index, prefix = table.pool.cache_blocks(
        table.block_ids,
        token_ids,
        table.num_hashed_blocks,
        min(table.num_slots, len(token_ids)),
        table.prefix_id,
        table.lease.owner,
    )
    table.num_hashed_blocks = index
    table.prefix_id = prefix
    table.next_cache_at = NEVER if prefix == NO_PREFIX else (index + 1) * table.pool.block_size
