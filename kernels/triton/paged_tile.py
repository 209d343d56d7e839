"""Gathering a tile of K or V rows from the paged cache through one request's block table."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_paged_tile(
    cache_ptr,
    block_table_row_ptr,
    pos,
    pos_mask,
    kv_head,
    d,
    d_mask,
    stride_block,
    stride_slot,
    stride_head,
    PAGE_SIZE: tl.constexpr,
):
    """Rows `pos` [N] of one KV head -> [N, D]; masked rows read as zero.

    A tile may span several pages (block_size 8 is below tl.dot's 16-row minimum), so the page is
    looked up per row; the block-table reads hit the cache, the K/V rows are what costs.
    """
    page = tl.load(block_table_row_ptr + pos // PAGE_SIZE, mask=pos_mask, other=0)
    # int64 before multiplying: block_id * stride overflows int32 once the pool passes 2**31 elements.
    row = page.to(tl.int64) * stride_block + (pos % PAGE_SIZE) * stride_slot + kv_head * stride_head
    return tl.load(cache_ptr + row[:, None] + d[None, :], mask=pos_mask[:, None] & d_mask[None, :], other=0.0)
