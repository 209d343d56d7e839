"""Prefill / extend attention: packed variable-length queries over their paged context, causal.

Request b's q_len queries are the last q_len positions of its seq_len-token context, so a chunked
prefill or a prefix-cache hit reads the earlier tokens from the cache exactly like its own: this
step's K/V must already be written (write_kv runs first). One program covers BLOCK_M query rows of
one request and one query head. A sliding window (window > 0) starts each tile's reads at its first
row's window and masks, per row, the positions before its own; a softcap bends the scores (scoring.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedserve.kernels.attention import CAUSAL, AttentionRules
from pagedserve.kernels.triton.paged_tile import load_paged_tile
from pagedserve.kernels.triton.precision import dot_in_fp32, tile_dot
from pagedserve.kernels.triton.scoring import log2_scores

LOG2_E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    req_ids_ptr,
    out_ptr,
    scale_log2,
    scale,
    softcap,
    window,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    USE_REQ_IDS: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
):
    pid = tl.program_id(0)
    head = tl.program_id(1)
    m_tile = tl.program_id(2)
    req = tl.load(req_ids_ptr + pid) if USE_REQ_IDS else pid
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + req)
    num_cached = seq_len - q_len
    kv_head = head // GROUP

    m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < q_len
    q_pos = num_cached + m
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q = tl.load(
        q_ptr + (q_start + m)[:, None].to(tl.int64) * stride_qt + head * stride_qh + d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    # Causal: this tile's last row sees positions up to num_cached + its index; a tile wholly past
    # q_len (the grid is sized for the longest request) sees nothing and its loop runs zero times.
    kv_end = tl.minimum(seq_len, num_cached + (m_tile + 1) * BLOCK_M)
    kv_end = tl.where(m_tile * BLOCK_M < q_len, kv_end, 0)
    # With a window, nothing before the tile's first row's window is read (and each row masks its own).
    kv_start = tl.where(window > 0, tl.maximum(num_cached + m_tile * BLOCK_M - window + 1, 0), 0)

    # Finite start for the running max (see decode_attention): fully masked rows stay nan-free.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    table_row = block_tables_ptr + req.to(tl.int64) * stride_bt

    for n0 in range(kv_start, kv_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pos_mask = pos < kv_end
        k = load_paged_tile(
            k_cache_ptr,
            table_row,
            pos,
            pos_mask,
            kv_head,
            d,
            d_mask,
            stride_kb,
            stride_ks,
            stride_kh,
            PAGE_SIZE,
        )
        s = log2_scores(tile_dot(q, tl.trans(k), UPCAST), scale_log2, scale, softcap, HAS_SOFTCAP)
        visible = pos_mask[None, :] & (pos[None, :] <= q_pos[:, None])
        visible = visible & ((window <= 0) | (pos[None, :] > q_pos[:, None] - window))
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = load_paged_tile(
            v_cache_ptr,
            table_row,
            pos,
            pos_mask,
            kv_head,
            d,
            d_mask,
            stride_vb,
            stride_vs,
            stride_vh,
            PAGE_SIZE,
        )
        acc = acc * alpha[:, None] + tile_dot(p.to(v.dtype), v, UPCAST)
        m_i = m_new

    # Every real row sees at least its own position, so l > 0 there; padding rows are not stored.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    result = (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty)
    out = out_ptr + (q_start + m)[:, None].to(tl.int64) * stride_ot + head * stride_oh + d[None, :]
    tl.store(out, result, mask=m_mask[:, None] & d_mask[None, :])


def prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    max_query_len: int,
    req_ids: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    rules: AttentionRules = CAUSAL,
) -> None:
    """Causal attention of each request's packed queries over its paged context, written into out.

    query/out [T, H, D]; caches [num_blocks, block_size, kv_heads, D]; req_ids (int32): the requests to
    run, default all; max_query_len: the longest q_len among them (sizes the grid, no device sync).
    """
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    for name, t in (("query", query), ("out", out), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along head_dim; got strides {t.stride()}")
    num_reqs = seq_lens.shape[0] if req_ids is None else req_ids.shape[0]
    if num_reqs == 0 or max_query_len == 0:
        return
    upcast = dot_in_fp32(k_cache.dtype == torch.float32 or query.dtype != k_cache.dtype)
    # fp32 tiles take the CUDA cores (ieee products), where 64x64x128 spills registers: halve them.
    big = 32 if upcast else 64
    if block_m is None:
        # tl.dot needs >= 16 rows; short extends (a few tokens) would waste most of a big tile.
        block_m = 16 if max_query_len <= 16 else big
    block_n = block_n or big
    grid = (num_reqs, num_heads, triton.cdiv(max_query_len, block_m))
    _prefill_kernel[grid](
        query,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        req_ids if req_ids is not None else seq_lens,  # a placeholder pointer when unused
        out,
        scale * LOG2_E,
        scale,
        rules.softcap or 1.0,
        rules.window or 0,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        # triton's stubs type a tl.constexpr parameter as tl.constexpr; a launch passes plain values
        GROUP=num_heads // num_kv_heads,  # pyright: ignore[reportArgumentType]
        HEAD_DIM=head_dim,  # pyright: ignore[reportArgumentType]
        BLOCK_M=block_m,  # pyright: ignore[reportArgumentType]
        BLOCK_N=block_n,  # pyright: ignore[reportArgumentType]
        BLOCK_D=triton.next_power_of_2(head_dim),  # pyright: ignore[reportArgumentType]
        PAGE_SIZE=k_cache.shape[1],  # pyright: ignore[reportArgumentType]
        USE_REQ_IDS=req_ids is not None,  # pyright: ignore[reportArgumentType]
        UPCAST=upcast,  # pyright: ignore[reportArgumentType]
        HAS_SOFTCAP=rules.softcap is not None,  # pyright: ignore[reportArgumentType]
    )
