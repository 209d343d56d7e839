"""Block batches as a broken or hostile peer might write them: every op that is no valid op is
refused alone with its path named, every valid one runs, and the pool stays consistent."""

from __future__ import annotations

import msgspec
from block_views import BLOCK_SIZE, NUM_BLOCKS, TTL
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.shared.protocol.blocks import OpError, Unreadable, read_batch

names = st.sampled_from(["a", "b", "c", ""])
counts = st.integers(min_value=-2, max_value=3 * BLOCK_SIZE)
token_lists = st.lists(st.integers(min_value=0, max_value=50), max_size=3 * BLOCK_SIZE)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=4), st.floats())
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=8)

# Ops near the valid ones (so that many run), and lists of anything (so that many do not).
ops = st.one_of(
    st.tuples(
        st.just("alloc"), st.sampled_from(["w0", "w9"]), names, names, token_lists, counts, st.booleans()
    ),
    st.tuples(st.just("grow"), names, counts, token_lists),
    st.tuples(st.just("fork"), names, names, names),
    st.tuples(st.just("free"), names, st.one_of(st.none(), counts)),
    st.tuples(st.just("resume"), names, counts, counts, token_lists),
    st.lists(anything, max_size=6),
    scalars,
).map(lambda op: list(op) if isinstance(op, tuple) else op)


@settings(max_examples=300, deadline=None, database=None)
@given(batches=st.lists(st.lists(ops, max_size=12), min_size=1, max_size=4))
def test_every_bad_op_is_refused_alone_naming_its_path_and_the_pool_stays_whole(batches) -> None:
    manager = BlockManager(lease_ttl_s=TTL)
    manager.add_pool("w0", NUM_BLOCKS, BLOCK_SIZE)
    for raw_ops in batches:
        batch = read_batch(msgspec.msgpack.encode({"seq": 1, "ops": raw_ops}))
        assert len(batch.ops) == len(raw_ops)
        results = manager.apply(batch.ops, 0.0).results
        assert len(results) == len(raw_ops)
        for index, (op, result) in enumerate(zip(batch.ops, results, strict=True)):
            if isinstance(op, Unreadable):
                assert isinstance(result, OpError) and f"$.ops[{index}]" in result.message, result
            else:
                # Read: it ran, or the core refused it (an unknown request), never for its form.
                assert not (isinstance(result, OpError) and "$.ops" in result.message), result
        assert manager.check_invariants() == []
    manager.reap_expired(TTL + 1)  # every table's lease lapses: all blocks come back
    assert manager.num_free_blocks("w0") == NUM_BLOCKS and manager.check_invariants() == []
