"""Paged attention in plain torch: the reference backend, and the default on the CPU.

Decode rows (one query) are batched: their K/V blocks are gathered into a padded tensor and one SDPA
runs per length bucket. Rows with several queries (prefill, a continued chunk, a prefix-cache hit)
run one SDPA each over their gathered context. GQA is folded into the query side everywhere
(q viewed [..., kv_heads, q_per_kv, ...] against K/V of kv_heads), never by repeating K/V: see
docs/cpu-performance.md for the measurements behind each choice.

A layer's rules (kernels/attention.py) join the causal mask: a sliding window is a lower bound on the
visible positions (and a prefill row gathers only the blocks its first query's window reaches); a
logit softcap runs the scores through tanh, which SDPA cannot, so those layers take the written-out
softmax(q k^T) v in float32, the form Hugging Face's eager attention uses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedserve.kernels.attention import CAUSAL, AttentionBackend, AttentionMetadata, AttentionRules

# Decode batches at least this large are split into length buckets, so short contexts do not pay
# for the longest one's padding; below it one padded gather is cheaper than several small ones.
_BUCKET_MIN_ROWS = 48
_ROWS_PER_BUCKET = 24
_MAX_BUCKETS = 8


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        # Indexed assignment on the flattened slot axis was the fastest of the scatter variants. A
        # narrower cache (a float32 model's bfloat16 K/V) takes its rows rounded to its dtype.
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = key.to(k_cache.dtype)
        v_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = value.to(v_cache.dtype)

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        rules: AttentionRules = CAUSAL,
    ) -> torch.Tensor:
        out = torch.empty_like(query)
        decode_rows: list[int] = []
        decode_tokens: list[int] = []
        start = 0
        for b, (q_len, s_len) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu, strict=True)):
            if q_len == 1:
                decode_rows.append(b)
                decode_tokens.append(start)
            elif q_len > 1:
                out[start : start + q_len] = _attend_one(
                    query[start : start + q_len], k_cache, v_cache, meta.block_tables[b], s_len, scale, rules
                )
            start += q_len
        if decode_rows:
            _decode(query, out, k_cache, v_cache, meta, decode_rows, decode_tokens, scale, rules)
        return out


def _attend_one(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
    rules: AttentionRules = CAUSAL,
) -> torch.Tensor:
    """Causal attention of one request's queries (the last `q_len` positions) over its context (from
    the first position its first query's window reaches)."""
    q_len, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    first = rules.first_visible(seq_len - q_len)
    span = seq_len - first
    blocks = block_table[first // block_size : -(-seq_len // block_size)]
    skip = first % block_size
    # A narrower cache (a float32 model's bfloat16 K/V) is read in the query's dtype.
    key = k_cache.index_select(0, blocks).to(query.dtype).view(-1, num_kv_heads, head_dim)[skip : skip + span]
    value = (
        v_cache.index_select(0, blocks).to(query.dtype).view(-1, num_kv_heads, head_dim)[skip : skip + span]
    )
    # [kv, group, L, D] queries against K/V broadcast over the group without a copy: ~2x faster
    # than enable_gqa or repeated K/V on the CPU.
    q = query.view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    k = key.transpose(0, 1).unsqueeze(1).expand(num_kv_heads, group, span, head_dim)
    v = value.transpose(0, 1).unsqueeze(1).expand(num_kv_heads, group, span, head_dim)
    if q_len == seq_len and rules == CAUSAL:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:
        # Earlier context is in the cache (a continued chunk or a prefix hit): query i sits at
        # position seq_len - q_len + i, so the causal diagonal is offset (SDPA's is_causal is not).
        positions = torch.arange(seq_len - q_len, seq_len, device=query.device)
        keys = torch.arange(first, seq_len, device=query.device)
        mask = keys[None, :] <= positions[:, None]
        if rules.window is not None:
            mask &= keys[None, :] > positions[:, None] - rules.window
        o = _attention(q, k, v, mask, scale, rules.softcap)
    return o.permute(2, 0, 1, 3).reshape(q_len, num_heads, head_dim)


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None
) -> torch.Tensor:
    """softmax(q k^T * scale) v over the positions `mask` keeps; with a softcap, written out (SDPA has no
    tanh) as Hugging Face's eager attention computes it: float32 softmax, probabilities in q's dtype."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(q.dtype), v)


def _decode(
    query: torch.Tensor,
    out: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    rows: list[int],
    tokens: list[int],
    scale: float,
    rules: AttentionRules,
) -> None:
    """One query per row over its paged context; rows are grouped by context length."""
    seq_lens = meta.seq_lens_cpu
    if len(rows) < _BUCKET_MIN_ROWS:
        buckets = [list(range(len(rows)))]
    else:
        order = sorted(range(len(rows)), key=lambda i: seq_lens[rows[i]])
        num_buckets = min(_MAX_BUCKETS, len(rows) // _ROWS_PER_BUCKET)
        size = -(-len(order) // num_buckets)
        buckets = [order[i : i + size] for i in range(0, len(order), size)]
    # Every row a decode, in order: row b is token b.
    all_contiguous = len(buckets) == 1 and len(rows) == meta.batch_size == query.shape[0]
    for bucket in buckets:
        bucket_rows = [rows[i] for i in bucket]
        bucket_tokens = [tokens[i] for i in bucket]
        lens = [seq_lens[r] for r in bucket_rows]
        if all_contiguous:
            # The common pure-decode step needs no index tensors.
            q = query
            tables = meta.block_tables
            lens_t = meta.seq_lens
        else:
            row_idx = torch.tensor(bucket_rows, device=query.device)
            q = query.index_select(0, torch.tensor(bucket_tokens, device=query.device))
            tables = meta.block_tables.index_select(0, row_idx)
            lens_t = meta.seq_lens.index_select(0, row_idx)
        o = _decode_padded(q, k_cache, v_cache, tables, lens_t, max(lens), min(lens), scale, rules)
        if all_contiguous:
            out.copy_(o)
        else:
            out[torch.tensor(bucket_tokens, device=query.device)] = o


def _decode_padded(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    min_len: int,
    scale: float,
    rules: AttentionRules,
) -> torch.Tensor:
    rows, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    num_blocks = -(-max_len // block_size)
    padded = num_blocks * block_size
    flat_tables = block_tables[:, :num_blocks].reshape(-1)
    # [rows, L, kv, D] -> [rows, kv, L, D]; the padding past each row's length is masked below.
    k = k_cache.index_select(0, flat_tables).to(query.dtype)  # a narrower cache in the query's dtype
    v = v_cache.index_select(0, flat_tables).to(query.dtype)
    k = k.view(rows, padded, num_kv_heads, head_dim).transpose(1, 2)
    v = v.view(rows, padded, num_kv_heads, head_dim).transpose(1, 2)
    q = query.view(rows, num_kv_heads, group, head_dim)
    positions = torch.arange(padded, device=query.device)[None, :]
    mask = positions < seq_lens[:, None]
    if rules.window is not None and rules.window < max_len:
        mask &= positions >= seq_lens[:, None] - rules.window
    elif min_len == padded and rules.softcap is None:
        mask = None  # every row sees every gathered position
    if mask is not None:
        mask = mask.view(rows, 1, 1, padded)
        o = _attention(q, k, v, mask, scale, rules.softcap)
    else:
        o = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return o.reshape(rows, num_heads, head_dim)
