"""PagedAttention arithmetic shared by the scheduler, the block manager and the worker."""

from __future__ import annotations


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` token slots: the last one may be partly filled."""
    return -(-num_tokens // block_size)
