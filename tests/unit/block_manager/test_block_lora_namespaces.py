"""Prefix caching under LoRA adapters: a block's key includes the request's adapter (its cache
namespace), so KV computed under one adapter's weights never serves another adapter or the base."""

from __future__ import annotations

import msgspec
from block_views import BLOCK_SIZE, ref_counts, tokens

from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.shared.protocol.blocks import Allocation, OpError, read_batch


def test_equal_prompts_under_different_adapters_share_nothing(manager: BlockManager) -> None:
    prompt = tokens(3 * BLOCK_SIZE + 1)
    base = manager.allocate("w0", "base", "s", prompt, 100, 0.0)
    a = manager.allocate("w0", "a", "s", prompt, 100, 0.0, cache_namespace="sql@1")
    b = manager.allocate("w0", "b", "s", prompt, 100, 0.0, cache_namespace="chat@1")
    assert base and a and b
    assert a.num_cached_tokens == b.num_cached_tokens == 0
    assert not set(base.block_ids) & set(a.block_ids) and not set(a.block_ids) & set(b.block_ids)
    # ...while the same adapter (and the base) still hit their own blocks.
    a2 = manager.allocate("w0", "a2", "s", prompt, 100, 0.0, cache_namespace="sql@1")
    base2 = manager.allocate("w0", "base2", "s", prompt, 100, 0.0)
    assert a2 and base2
    assert a2.block_ids[:3] == a.block_ids[:3] and a2.num_cached_tokens == 3 * BLOCK_SIZE
    assert base2.block_ids[:3] == base.block_ids[:3] and base2.num_cached_tokens == 3 * BLOCK_SIZE
    refs = ref_counts(manager)
    assert [refs[i] for i in a.block_ids[:3]] == [2, 2, 2]


def test_blocks_cached_later_by_growth_stay_in_their_namespace(manager: BlockManager) -> None:
    prompt = tokens(BLOCK_SIZE - 1)
    a = manager.allocate("w0", "a", "s", prompt, 100, 0.0, cache_namespace="x")
    assert a is not None
    manager.grow("a", 1, [999], 0.0)  # fills the first block: cached under "x"
    manager.free("a")
    full = prompt + [999, 5]
    assert manager.allocate("w0", "base", "s", full, 100, 1.0).num_cached_tokens == 0  # type: ignore[union-attr]
    hit = manager.allocate("w0", "x2", "s", full, 100, 1.0, cache_namespace="x")
    assert hit is not None and hit.num_cached_tokens == BLOCK_SIZE


def test_the_namespace_travels_as_an_optional_trailing_alloc_argument(manager: BlockManager) -> None:
    prompt = tokens(2 * BLOCK_SIZE + 1)
    batch = read_batch(
        msgspec.msgpack.encode(
            {
                "seq": 1,
                "ops": [
                    ["alloc", "w0", "a", "s", prompt, 100, True, "sql@1"],
                    ["alloc", "w0", "b", "s", prompt, 100, True],  # the base: the namespace left out
                    ["alloc", "w0", "c", "s", prompt, 100, True, "sql@1"],
                    ["alloc", "w0", "d", "s", prompt, 100, True, 7],
                    ["alloc", "w0", "e", "s", prompt, 100, True, ""],
                    ["grow", "a", 1],
                ],
            }
        )
    )
    a, b, c, bad_type, empty, _grow = manager.apply(batch.ops, 0.0).results
    assert isinstance(a, Allocation) and isinstance(b, Allocation) and isinstance(c, Allocation)
    assert b.num_cached_tokens == 0 and c.num_cached_tokens == 2 * BLOCK_SIZE
    assert c.block_ids[:2] == a.block_ids[:2]
    assert bad_type == OpError("Expected `str | null`, got `int` - at `$.ops[3][7]`")
    assert empty == OpError("Expected `str` of length >= 1 - at `$.ops[4][7]`")
