"""The KV pool: sizing from a byte budget, layout, and copy-on-write block copies."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.worker.kv_cache import KVCache, KVCacheShape, num_blocks_for_budget

SHAPE = KVCacheShape(num_layers=2, block_size=8, num_kv_heads=2, head_dim=4, dtype=torch.float32)


def test_a_block_costs_k_and_v_of_every_layer():
    assert SHAPE.bytes_per_block == 2 * 2 * 8 * 2 * 4 * 4
    bf16 = KVCacheShape(2, 8, 2, 4, torch.bfloat16)
    assert bf16.bytes_per_block == SHAPE.bytes_per_block // 2


def test_budget_gives_whole_blocks_and_refuses_less_than_one():
    assert num_blocks_for_budget(SHAPE, SHAPE.bytes_per_block * 7 + 100) == 7
    with pytest.raises(ValueError, match="holds no block"):
        num_blocks_for_budget(SHAPE, SHAPE.bytes_per_block - 1)


def test_cache_layout_is_blocks_by_slots_by_heads():
    cache = KVCache(SHAPE, 5, "cpu")
    assert len(cache.layers()) == 2
    for k, v in cache.layers():
        assert k.shape == v.shape == (5, 8, 2, 4)
        assert not k.any() and not v.any()  # zeroed: padded reads must never meet NaN


def test_copy_blocks_copies_k_and_v_in_every_layer():
    cache = KVCache(SHAPE, 5, "cpu")
    for t in (*cache.k, *cache.v):
        t.copy_(torch.randn(t.shape))
    before = [t.clone() for t in (*cache.k, *cache.v)]
    cache.copy_blocks([(1, 3), (2, 4)])
    for t, old in zip((*cache.k, *cache.v), before, strict=True):
        assert torch.equal(t[3], old[1]) and torch.equal(t[4], old[2])
        assert torch.equal(t[:3], old[:3])
