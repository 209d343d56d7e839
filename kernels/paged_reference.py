"""A dense reference for paged attention, plus random paged batches: what the Triton kernels are checked
against, by their unit tests and on a real GPU by `python -m pagedserve.ops.gpu.check`. Only torch.

Deliberately plain: each request's context is gathered through its block table into contiguous K/V,
then softmax(q k^T) v in fp32 with a causal offset, a layer's sliding window and logit softcap applied
as Hugging Face's eager attention applies them. Nothing shared with the kernels or the torch backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.kernels.attention import CAUSAL, AttentionMetadata, AttentionRules

# Per-dtype (atol, rtol) against the fp32 reference: the kernels round P to the input dtype before P @ V.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (3e-3, 3e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


@dataclass(slots=True)
class PagedBatch:
    """One step's inputs, already on the device, with this step's K/V already in the cache."""

    query: torch.Tensor  # [T, H, D]
    key: torch.Tensor  # [T, kv, D] this step's new K (also written into k_cache)
    value: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, kv, D]
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32
    query_start_loc: torch.Tensor  # [B + 1] int32
    query_lens: list[int]
    seq_lens_list: list[int]

    def metadata(self) -> AttentionMetadata:
        """The attention metadata a runner would build for this batch."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping,
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            block_tables=self.block_tables,
            max_query_len=max(self.query_lens),
            max_seq_len=max(self.seq_lens_list),
            query_lens_cpu=self.query_lens,
            seq_lens_cpu=self.seq_lens_list,
        )


def make_paged_batch(
    seq_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
) -> PagedBatch:
    """Random caches with shuffled, non-contiguous block tables; unused slots hold large garbage."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + 3  # spares that no table names
    ids = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(blocks_per_req), dtype=torch.int32)
    taken = 0
    for b, n in enumerate(blocks_per_req):
        tables[b, :n] = ids[taken : taken + n]
        taken += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    # Garbage of large magnitude: a kernel that reads past seq_len or through a wrong page shows it.
    k_cache = torch.full(shape, 1e4).to(dtype)
    v_cache = torch.full(shape, -1e4).to(dtype)
    slot_parts: list[torch.Tensor] = []
    for b, (s, q) in enumerate(zip(seq_lens, query_lens, strict=True)):
        pos = torch.arange(s)
        pages = tables[b, pos // block_size].long()
        k_cache[pages, pos % block_size] = torch.randn(s, num_kv_heads, head_dim, generator=gen).to(dtype)
        v_cache[pages, pos % block_size] = torch.randn(s, num_kv_heads, head_dim, generator=gen).to(dtype)
        slot_parts.append((pages * block_size + pos % block_size)[s - q :])
    slot_mapping = torch.cat(slot_parts)
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    num_tokens = sum(query_lens)
    start_loc = [0]
    for q in query_lens:
        start_loc.append(start_loc[-1] + q)
    return PagedBatch(
        query=torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype).to(device),
        key=flat_k[slot_mapping].clone().to(device),
        value=flat_v[slot_mapping].clone().to(device),
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        slot_mapping=slot_mapping.to(device),
        block_tables=tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(start_loc, dtype=torch.int32, device=device),
        query_lens=list(query_lens),
        seq_lens_list=list(seq_lens),
    )


def reference_attention(batch: PagedBatch, scale: float, rules: AttentionRules = CAUSAL) -> torch.Tensor:
    """fp32 [T, H, D]: each query attends to context positions <= its own (and > its own - window),
    read via the block table."""
    q_all = batch.query.float().cpu()
    k_cache = batch.k_cache.float().cpu()
    v_cache = batch.v_cache.float().cpu()
    tables = batch.block_tables.cpu()
    block_size = k_cache.shape[1]
    num_heads, num_kv_heads = q_all.shape[1], k_cache.shape[2]
    out = torch.empty_like(q_all)
    start = 0
    for b, (s, q_len) in enumerate(zip(batch.seq_lens_list, batch.query_lens, strict=True)):
        pos = torch.arange(s)
        pages = tables[b, pos // block_size].long()
        k = k_cache[pages, pos % block_size].repeat_interleave(num_heads // num_kv_heads, dim=1)
        v = v_cache[pages, pos % block_size].repeat_interleave(num_heads // num_kv_heads, dim=1)
        q = q_all[start : start + q_len]  # [q_len, H, D]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if rules.softcap is not None:
            scores = torch.tanh(scores / rules.softcap) * rules.softcap
        q_pos = torch.arange(s - q_len, s)
        hidden = pos[None, None, :] > q_pos[None, :, None]
        if rules.window is not None:
            hidden |= pos[None, None, :] <= q_pos[None, :, None] - rules.window
        scores = scores.masked_fill(hidden, float("-inf"))
        out[start : start + q_len] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
        start += q_len
    return out
