"""One worker's KV blocks: ref counts, the LRU free list and the prefix cache.

The pool knows blocks, never requests (the manager knows those). Block ids index the worker's
KV tensors directly, so a pool of N blocks owns exactly the ids 0..N-1.

Prefix caching keys a full block by `(parent prefix id, its token ids)`. A prefix id names a
*content* (the exact tokens from position 0 to the end of that block), handed out once when
the content is first cached. Because the key holds the tokens themselves and the parent's id
is unique, a dict lookup is an exact match: two different prefixes can never collide, so a
hit never serves another prompt's KV. `block_hash` is only the display form of the key.

A request's *cache namespace* (its LoRA adapter: KV computed under other weights is other content)
picks the root of its chain: the base model's is ROOT_PREFIX, each namespace gets its own root id
the first time it is seen, so equal tokens under two adapters never share a key.

A block is keyed when its slots are given, before the worker has written them, so that a request
of the same step can share it (the worker writes each layer's K/V before that layer reads). Until
its owner confirms the write (by freeing the table with the slots computed), the key is *pending*:
only that owner may hit it, since only it knows the step that writes it runs first. An owner that
vanishes (a killed scheduler, one that gave up on us and took a new lease name) leaves pending
keys over KV nobody wrote; they leave the cache with its tables and never serve anyone else.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

ROOT_PREFIX = 0  # prefix id of the empty prefix: the parent of every first block
NO_PREFIX = -1  # a table whose chain broke (conflicting content) caches nothing further

CacheKey = tuple[int, tuple[int, ...]]


@dataclass(slots=True)
class Block:
    id: int
    ref_count: int = 0
    cache_key: CacheKey | None = None  # set only while the block is full and cached
    prefix_id: int = ROOT_PREFIX  # the content this block ends; meaningful while cache_key is set
    pending: str | None = None  # the owner whose unconfirmed step writes it; None once confirmed


def block_hash(key: CacheKey) -> str:
    """Hex form of a cache key, for the health dump only: prefix ids are handed out in the order
    contents are first cached, so equal hashes mean equal content only within one pool's life."""
    return format(hash(key) & 0xFFFF_FFFF_FFFF_FFFF, "016x")


class BlockPool:
    """Blocks of one worker. Every method is O(1) per block it touches."""

    __slots__ = (
        "pool_id",
        "num_blocks",
        "block_size",
        "blocks",
        "free",
        "cached",
        "roots",
        "_next_prefix_id",
    )

    def __init__(self, pool_id: str, num_blocks: int, block_size: int) -> None:
        self.pool_id = pool_id
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        # LRU free list: the front is the least recently freed block, handed out first, so the
        # most recently freed cached prefixes survive longest. OrderedDict gives O(1) removal of
        # a cached free block revived by a prefix hit.
        self.free: OrderedDict[int, Block] = OrderedDict((b.id, b) for b in self.blocks)
        self.cached: dict[CacheKey, Block] = {}
        self.roots: dict[str, int] = {}  # cache namespace (a LoRA adapter) -> the root of its chains
        self._next_prefix_id = ROOT_PREFIX + 1

    def root_prefix(self, namespace: str | None) -> int:
        """The content id of the empty prefix under `namespace` (None: the base model's, ROOT_PREFIX)."""
        if namespace is None:
            return ROOT_PREFIX
        root = self.roots.get(namespace)
        if root is None:
            root = self.roots[namespace] = self._next_prefix_id
            self._next_prefix_id = root + 1
        return root

    def take_free(self) -> Block:
        """The least recently freed block, now referenced once; its cached content is evicted."""
        block = self.free.popitem(last=False)[1]
        if block.cache_key is not None:
            self.uncache(block)
        block.ref_count = 1
        return block

    def uncache(self, block: Block) -> None:
        """Drop the block's key: its content may never have been written (or it is evicted)."""
        assert block.cache_key is not None, f"block {block.id} is not cached"
        del self.cached[block.cache_key]
        block.cache_key = None
        block.pending = None

    def visible(self, block: Block, owner: str) -> bool:
        """May `owner` hit this cached block? Confirmed ones are everyone's; pending ones their owner's."""
        return block.pending is None or block.pending == owner

    def share(self, block: Block) -> None:
        """One more reference; a free cached block revived by a prefix hit leaves the free list."""
        if block.ref_count == 0:
            del self.free[block.id]
        block.ref_count += 1

    def release(self, block: Block) -> bool:
        """Drop one reference; True when it was the last (the block is free again, hash kept)."""
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free[block.id] = block
            return True
        return False

    def cache_blocks(
        self, block_ids: list[int], token_ids: list[int], index: int, num_tokens: int, prefix: int, owner: str
    ) -> tuple[int, int]:
        """Cache the blocks of a table from logical block `index` on, while their tokens lie
        within token_ids[:num_tokens]; `prefix` is the content id of the blocks before `index`.
        New keys are pending on `owner`. Returns (the next index to cache, the content id of
        everything cached so far).

        Content already cached in another block keeps that entry (one cached copy is enough),
        and the chain goes on through it, unless that entry is pending on another owner: it may
        never be written, and this block is, so this block takes the key over. A block already
        cached under another key holds other content: the chain stops there with NO_PREFIX.
        """
        bs = self.block_size
        blocks = self.blocks
        cached = self.cached
        start = index * bs
        while start + bs <= num_tokens and prefix != NO_PREFIX:
            block = blocks[block_ids[index]]
            key = (prefix, tuple(token_ids[start : start + bs]))
            if block.cache_key is None:
                existing = cached.setdefault(key, block)  # one hash of the key, not two
                if existing is block:
                    prefix = self._next_prefix_id
                    self._next_prefix_id = prefix + 1
                    block.cache_key = key
                    block.prefix_id = prefix
                    block.pending = owner
                else:
                    prefix = existing.prefix_id
                    if existing.pending is not None and existing.pending != owner:
                        self.uncache(existing)  # same content, so the same content id
                        cached[key] = block
                        block.cache_key = key
                        block.prefix_id = prefix
                        block.pending = owner
            else:
                existing = cached.get(key)
                prefix = NO_PREFIX if existing is None else existing.prefix_id
            index += 1
            start += bs
        return index, prefix
