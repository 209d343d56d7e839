"""A request's block table: the physical blocks behind its logical blocks 0..n, and what they hold."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from pagedserve.services.block_manager.leases import Lease
from pagedserve.services.block_manager.pool import BlockPool

NEVER = sys.maxsize  # next_cache_at of a table that caches nothing more


@dataclass(slots=True)
class BlockTable:
    """Slots are KV positions the request has been given to write: always exactly
    ceil(num_slots / block_size) blocks. Known tokens may run ahead of the slots (a prompt
    prefilled in chunks) or behind them (a decode scheduled before its input token is known);
    a block is cached only once both its slots and its tokens are complete."""

    request_id: str
    pool: BlockPool
    lease: Lease
    block_ids: list[int]
    num_slots: int
    capacity: int  # len(block_ids) * block_size: slots that fit without a fresh block
    # Slots grow may give without looking at any block: the capacity, except after a fork, when
    # the partly filled last block is shared and the next write must check for copy-on-write.
    write_limit: int
    token_ids: list[int]
    num_hashed_blocks: int  # leading blocks already offered to the prefix cache
    prefix_id: int  # content id of those leading blocks; NO_PREFIX once the chain broke
    next_cache_at: int  # slots and tokens both reaching this mean one more block to cache
    allocated_at: float = 0.0  # when the table was made: the age the live view shows
