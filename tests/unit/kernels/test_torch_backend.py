"""TorchAttentionBackend: paged attention equals dense causal attention over each request's context."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest
import torch

from pagedserve.kernels.attention import AttentionMetadata
from pagedserve.kernels.torch_backend import TorchAttentionBackend

HEAD_DIM = 32
NUM_HEADS = 8


@dataclass(slots=True)
class Case:
    query: torch.Tensor  # [T, H, D] packed
    keys: list[torch.Tensor]  # per request, its whole context [seq_len, kv, D]
    values: list[torch.Tensor]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: AttentionMetadata


def make_case(
    seq_lens: list[int],
    query_lens: list[int],
    num_kv_heads: int,
    block_size: int,
    seed: int,
    dtype: torch.dtype = torch.float32,
) -> Case:
    """Earlier context already in the cache; this step's K/V written through the backend.

    Block tables are shuffled and non-contiguous; every slot nobody wrote holds large garbage.
    """
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    backend = TorchAttentionBackend()
    blocks_per_request = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_request) + 3
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    shape = (num_blocks, block_size, num_kv_heads, HEAD_DIM)
    k_cache = (torch.randn(shape, generator=gen) * 100).to(dtype)
    v_cache = (torch.randn(shape, generator=gen) * 100).to(dtype)
    tables, keys, values, queries, slots = [], [], [], [], []
    for seq_len, q_len, n in zip(seq_lens, query_lens, blocks_per_request, strict=True):
        table = [ids.pop() for _ in range(n)]
        tables.append(table)
        k = torch.randn(seq_len, num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
        v = torch.randn(seq_len, num_kv_heads, HEAD_DIM, generator=gen).to(dtype)
        keys.append(k)
        values.append(v)
        queries.append(torch.randn(q_len, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype))
        for pos in range(seq_len - q_len):  # cached context, as earlier steps left it
            k_cache[table[pos // block_size], pos % block_size] = k[pos]
            v_cache[table[pos // block_size], pos % block_size] = v[pos]
        slots += [
            table[p // block_size] * block_size + p % block_size for p in range(seq_len - q_len, seq_len)
        ]
    width = max(len(t) for t in tables)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=list(query_lens),
        seq_lens_cpu=list(seq_lens),
    )
    new_k = torch.cat([k[s - q :] for k, s, q in zip(keys, seq_lens, query_lens, strict=True)])
    new_v = torch.cat([v[s - q :] for v, s, q in zip(values, seq_lens, query_lens, strict=True)])
    backend.write_kv(new_k, new_v, k_cache, v_cache, meta.slot_mapping)
    return Case(torch.cat(queries), keys, values, k_cache, v_cache, meta)


def dense_reference(case: Case, scale: float) -> torch.Tensor:
    """softmax(q k^T) v in float64 per request and query head; query head h reads kv head h // group."""
    out = []
    start = 0
    for k, v, q_len in zip(case.keys, case.values, case.meta.query_lens_cpu, strict=True):
        q = case.query[start : start + q_len].double()
        start += q_len
        seq_len = k.shape[0]
        group = NUM_HEADS // k.shape[1]
        k64 = k.double().repeat_interleave(group, dim=1)  # [S, H, D]
        v64 = v.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,shd->hqs", q, k64) * scale
        positions = torch.arange(seq_len - q_len, seq_len)
        allowed = torch.arange(seq_len)[None, :] <= positions[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        out.append(torch.einsum("hqs,shd->qhd", scores.softmax(-1), v64))
    return torch.cat(out)


def random_batch(rng: random.Random, size: int) -> tuple[list[int], list[int]]:
    """A mix of decodes, whole prefills and continued chunks / prefix hits, in random order."""
    seq_lens, query_lens = [], []
    for _ in range(size):
        kind = rng.choice(["decode", "prefill", "extend"])
        seq_len = rng.randint(1, 200)
        if kind == "decode":
            q_len = 1
        elif kind == "prefill":
            q_len = seq_len
        else:
            seq_len = max(seq_len, 2)
            q_len = rng.randint(1, seq_len - 1)
        seq_lens.append(seq_len)
        query_lens.append(q_len)
    return seq_lens, query_lens


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_mixed_batch_matches_dense_reference(group, block_size, seed):
    rng = random.Random(seed * 100 + block_size + group)
    seq_lens, query_lens = random_batch(rng, rng.randint(1, 8))
    case = make_case(seq_lens, query_lens, NUM_HEADS // group, block_size, seed)
    scale = HEAD_DIM**-0.5
    out = TorchAttentionBackend().forward(case.query, case.k_cache, case.v_cache, case.meta, scale)
    torch.testing.assert_close(out.double(), dense_reference(case, scale), atol=1e-5, rtol=0)


@pytest.mark.parametrize("with_prefill", [False, True])
def test_large_decode_batch_is_bucketed_by_length_and_exact(with_prefill):
    rng = random.Random(7)
    seq_lens = [rng.randint(1, 300) for _ in range(100)]
    query_lens = [1] * len(seq_lens)
    if with_prefill:  # decodes then no longer map row b to token b
        seq_lens.insert(40, 50)
        query_lens.insert(40, 20)
    case = make_case(seq_lens, query_lens, 2, 16, seed=3)
    scale = 0.3
    out = TorchAttentionBackend().forward(case.query, case.k_cache, case.v_cache, case.meta, scale)
    torch.testing.assert_close(out.double(), dense_reference(case, scale), atol=1e-5, rtol=0)


def test_equal_length_decodes_need_no_mask():
    case = make_case([32, 32, 32], [1, 1, 1], 4, 16, seed=5)
    out = TorchAttentionBackend().forward(case.query, case.k_cache, case.v_cache, case.meta, 0.2)
    torch.testing.assert_close(out.double(), dense_reference(case, 0.2), atol=1e-5, rtol=0)


def test_write_kv_stores_each_token_at_its_slot():
    k_cache = torch.zeros(4, 8, 2, HEAD_DIM)
    v_cache = torch.zeros(4, 8, 2, HEAD_DIM)
    key, value = torch.randn(3, 2, HEAD_DIM), torch.randn(3, 2, HEAD_DIM)
    slots = torch.tensor([3 * 8 + 5, 0, 1 * 8 + 7])
    TorchAttentionBackend().write_kv(key, value, k_cache, v_cache, slots)
    for i, (block, offset) in enumerate([(3, 5), (0, 0), (1, 7)]):
        assert torch.equal(k_cache[block, offset], key[i])
        assert torch.equal(v_cache[block, offset], value[i])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 3


def test_bfloat16_cache_is_close_to_the_float32_reference():
    rng = random.Random(11)
    seq_lens, query_lens = random_batch(rng, 6)
    case = make_case(seq_lens, query_lens, 4, 16, seed=11, dtype=torch.bfloat16)
    out = TorchAttentionBackend().forward(case.query, case.k_cache, case.v_cache, case.meta, 0.2)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), dense_reference(case, 0.2), atol=3e-2, rtol=3e-2)


def test_float32_queries_over_bfloat16_caches_match_the_reference_of_the_rounded_kv():
    """kv_cache_dtype bfloat16 under a float32 model: K/V rounded once as stored, attention in float32."""
    rng = random.Random(13)
    seq_lens, query_lens = random_batch(rng, 6)
    case = make_case(seq_lens, query_lens, 4, 16, seed=13)
    k_cache, v_cache = (
        torch.zeros_like(case.k_cache, dtype=torch.bfloat16),
        torch.zeros_like(case.v_cache, dtype=torch.bfloat16),
    )
    new_k = torch.cat([k[s - q :] for k, s, q in zip(case.keys, seq_lens, query_lens, strict=True)])
    backend = TorchAttentionBackend()
    backend.write_kv(new_k, new_k, k_cache, v_cache, case.meta.slot_mapping)
    assert torch.equal(k_cache.view(-1, *k_cache.shape[2:])[case.meta.slot_mapping], new_k.bfloat16())
    k_cache, v_cache = case.k_cache.bfloat16(), case.v_cache.bfloat16()
    out = backend.forward(case.query, k_cache, v_cache, case.meta, 0.2)
    assert out.dtype == torch.float32
    rounded = replace(
        case,
        keys=[k.bfloat16().float() for k in case.keys],
        values=[v.bfloat16().float() for v in case.values],
    )
    torch.testing.assert_close(out.double(), dense_reference(rounded, 0.2), atol=1e-5, rtol=0)
