"""Decode attention: one query token per request over its paged context, with optional split-KV.

One program covers one request and one KV head, and all the query heads that share that KV head
(GQA): K/V are read once per group, which is what bounds decode (it is memory-bound). The group is
padded to 16 rows because tl.dot needs every dim >= 16 on a GPU; the padding costs FLOPs, not bytes.

Split-KV: for long contexts a batch gives too few programs to fill the GPU, so each request's
context is cut into partitions run by separate programs; each writes its normalised partial output
and log-sum-exp, and a second small kernel merges them.

A sliding window (WINDOW > 0) bounds what is read: only the last WINDOW positions of each context,
and the partitions cover those alone. A softcap bends the scores (scoring.py).
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
# Below this many context tokens per partition, the merge costs more than the parallelism gains.
MIN_PARTITION_TOKENS = 256


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    req_ids_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    scale_log2,
    scale,
    softcap,
    window,
    partition_len,
    num_heads,
    num_splits,
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
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    USE_REQ_IDS: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    req = tl.load(req_ids_ptr + pid) if USE_REQ_IDS else pid
    token = tl.load(query_start_loc_ptr + req)
    seq_len = tl.load(seq_lens_ptr + req)
    # The first position the query sees (window > 0: the last `window` positions); partitions start there.
    first = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    start = first + split * partition_len
    end = tl.minimum(start + partition_len, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q = tl.load(
        q_ptr + token * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    # Finite start for the running max: a row that has seen only masked scores keeps
    # exp2(m - m_new) == 1 instead of exp2(-inf - -inf) == nan.
    m_i = tl.full([BLOCK_G], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    table_row = block_tables_ptr + req.to(tl.int64) * stride_bt

    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pos_mask = pos < end
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
        s = tl.where(pos_mask[None, :], s, float("-inf"))
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

    # An empty partition (context shorter than this split's start) has l == 0: guard the division;
    # the merge kernel skips it by index anyway.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    result = acc / l_safe[:, None]
    row_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        part_row = (pid * num_heads + heads) * num_splits + split
        tl.store(part_out_ptr + part_row[:, None] * HEAD_DIM + d[None, :], result, mask=row_mask)
        tl.store(part_lse_ptr + part_row, m_i + tl.log2(l_safe), mask=g_mask)
    else:
        out = out_ptr + token * stride_ot + heads[:, None] * stride_oh + d[None, :]
        tl.store(out, result.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _merge_partitions_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    req_ids_ptr,
    window,
    partition_len,
    num_heads,
    num_splits,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    USE_REQ_IDS: tl.constexpr,
):
    pid = tl.program_id(0)
    head = tl.program_id(1)
    req = tl.load(req_ids_ptr + pid) if USE_REQ_IDS else pid
    token = tl.load(query_start_loc_ptr + req)
    seq_len = tl.load(seq_lens_ptr + req)
    # Only partitions that start inside this request's visible context hold data; the rest were never written.
    first = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    num_valid = tl.cdiv(seq_len - first, partition_len)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < num_valid
    d_mask = d < HEAD_DIM
    row = (pid * num_heads + head) * num_splits + s
    lse = tl.load(part_lse_ptr + row, mask=s_mask, other=float("-inf"))
    weight = tl.where(s_mask, tl.exp2(lse - tl.max(lse, axis=0)), 0.0)
    part = tl.load(
        part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0
    )
    # pyright infers tl.sum's result from tl.reduce, whose tuple-input case returns a tuple: a stub gap.
    result = tl.sum(part * weight[:, None], axis=0) / tl.sum(weight, axis=0)  # pyright: ignore[reportOperatorIssue]
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + d, result.to(out_ptr.dtype.element_ty), mask=d_mask
    )


def choose_num_splits(num_programs: int, max_seq_len: int, device: torch.device) -> int:
    """Enough partitions to give each SM about two programs, never partitions shorter than the minimum."""
    if device.type == "cuda":
        target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target = 8
    by_occupancy = triton.cdiv(target, max(num_programs, 1))
    by_length = triton.cdiv(max_seq_len, MIN_PARTITION_TOKENS)
    return max(1, min(by_occupancy, by_length))


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    max_seq_len: int,
    req_ids: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_n: int = 64,
    rules: AttentionRules = CAUSAL,
) -> None:
    """Attention of each request's single query token (at query_start_loc[req]) over its context (the
    last `rules.window` positions of it when the layer has a window; scores softcapped if it has one).

    query/out [T, H, D] (the whole packed step; only the selected requests' rows are written);
    caches [num_blocks, block_size, kv_heads, D]; req_ids: the requests to run (int32), default all.
    num_splits: partitions per request (1 = no split-KV), default chosen from occupancy and length.
    """
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    for name, t in (("query", query), ("out", out), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along head_dim; got strides {t.stride()}")
    num_reqs = seq_lens.shape[0] if req_ids is None else req_ids.shape[0]
    if num_reqs == 0 or max_seq_len == 0:
        return
    group = num_heads // num_kv_heads
    span = max_seq_len if rules.window is None else min(rules.window, max_seq_len)  # the most any row reads
    if num_splits is None:
        num_splits = choose_num_splits(num_reqs * num_kv_heads, span, query.device)
    partition_len = triton.cdiv(triton.cdiv(span, num_splits), block_n) * block_n
    num_splits = triton.cdiv(span, partition_len)
    split = num_splits > 1
    if split:
        part_out = torch.empty(
            num_reqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device
        )
        part_lse = torch.empty(num_reqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
    else:
        part_out = part_lse = out  # unused: SPLIT=False never touches them
    req_arg = req_ids if req_ids is not None else seq_lens  # a placeholder pointer when unused
    block_d = triton.next_power_of_2(head_dim)
    _decode_kernel[(num_reqs, num_kv_heads, num_splits)](
        query,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        req_arg,
        out,
        part_out,
        part_lse,
        scale * LOG2_E,
        scale,
        rules.softcap or 1.0,
        rules.window or 0,
        partition_len,
        num_heads,
        num_splits,
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
        GROUP=group,  # pyright: ignore[reportArgumentType]
        HEAD_DIM=head_dim,  # pyright: ignore[reportArgumentType]
        BLOCK_G=max(16, triton.next_power_of_2(group)),  # pyright: ignore[reportArgumentType]
        BLOCK_D=block_d,  # pyright: ignore[reportArgumentType]
        BLOCK_N=block_n,  # pyright: ignore[reportArgumentType]
        PAGE_SIZE=k_cache.shape[1],  # pyright: ignore[reportArgumentType]
        USE_REQ_IDS=req_ids is not None,  # pyright: ignore[reportArgumentType]
        SPLIT=split,  # pyright: ignore[reportArgumentType]
        UPCAST=dot_in_fp32(k_cache.dtype == torch.float32 or query.dtype != k_cache.dtype),  # pyright: ignore[reportArgumentType]
        HAS_SOFTCAP=rules.softcap is not None,  # pyright: ignore[reportArgumentType]
    )
    if split:
        _merge_partitions_kernel[(num_reqs, num_heads)](
            part_out,
            part_lse,
            out,
            seq_lens,
            query_start_loc,
            req_arg,
            rules.window or 0,
            partition_len,
            num_heads,
            num_splits,
            out.stride(0),
            out.stride(1),
            # triton's stubs type a tl.constexpr parameter as tl.constexpr; a launch passes plain values
            HEAD_DIM=head_dim,  # pyright: ignore[reportArgumentType]
            BLOCK_D=block_d,  # pyright: ignore[reportArgumentType]
            BLOCK_S=triton.next_power_of_2(num_splits),  # pyright: ignore[reportArgumentType]
            USE_REQ_IDS=req_ids is not None,  # pyright: ignore[reportArgumentType]
        )
