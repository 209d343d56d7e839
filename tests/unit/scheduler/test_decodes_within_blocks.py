"""A decode within the blocks its request holds sends the block manager nothing: at one request 15 steps
of 16 need no batch at all. The table catches up with the next grow or free, so the block manager ends
with the slots, tokens and prefix-cache blocks it would have had if every step had been told; and under
any mix of sharing, preemption, proposals and aborts no step writes outside the blocks it holds."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_resumption import BS, SPEC, PoolWorker, drive
from test_scheduler_core import ScriptedWorker, W, greedy, make, run

from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.services.scheduler.scheduler import Scheduler, SchedulerLimits
from pagedserve.shared.protocol.blocks import Alloc, Free, Grow
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.speculative_config import SpeculativeConfig


def test_one_request_asks_the_block_manager_only_for_blocks_and_the_free():
    sched, bm = make(block_size=8, pipeline_depth=1)
    sched.add_request("a", [1, 2, 3], greedy(20), 0.0)
    worker = ScriptedWorker()
    batches, steps = [], 0
    while sched.can_schedule(W):
        plan = sched.schedule(W, 0.0)
        batches.append(plan.block_ops)
        execute = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
        if execute is None:
            break
        steps += 1
        if any(isinstance(op, Grow) for op in plan.block_ops):  # the table caught up, to the slot
            assert len(bm.table("a")) * 8 >= sched.requests["a"].num_slots_given
        sched.on_step_result(W, worker.execute(execute), 0.0)
    # 20 tokens: the prompt's step, then 19 decodes writing slots 3..21; slots 8 and 16 start blocks.
    assert steps == 20
    *grown, final = [ops for ops in batches if ops]
    assert [[type(op) for op in ops] for ops in grown] == [[Alloc], [Grow], [Grow]]
    assert [ops[0].num_new_tokens for ops in grown[1:]] == [6, 8]  # slots 3-8, then 9-16
    assert [type(op) for op in final] == [Grow, Free]
    assert final[0].num_new_tokens == 5 and final[1].num_computed == 22  # slots 17-21 told with the free
    assert bm.num_cached_blocks() == 2  # both full blocks of computed slots, as if told every step
    assert bm.num_requests() == 0 and bm.num_free_blocks(W) == 64 and bm.check_invariants() == []


def test_a_batch_that_goes_anyway_carries_the_decodes_within_their_blocks():
    sched, bm = make(block_size=8, pipeline_depth=1)
    sched.add_request("a", [1, 2, 3], greedy(6), 0.0)
    worker = ScriptedWorker()
    plan = sched.schedule(W, 0.0)
    sched.on_step_result(W, worker.execute(sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)), 0.0)
    plan = sched.schedule(W, 0.0)
    assert plan.block_ops == [] and len(plan.entries) == 1  # a's decode, within its block
    sched.on_step_result(W, worker.execute(sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)), 0.0)
    sched.add_request("b", [7, 8, 9], greedy(3), 0.0)
    plan = sched.schedule(W, 0.0)
    grows = [op for op in plan.block_ops if isinstance(op, Grow)]
    assert [type(op) for op in plan.block_ops].count(Alloc) == 1
    assert [(op.request_id, op.num_new_tokens) for op in grows] == [("a", 2)]  # the untold slot and its own
    sched.on_step_result(W, worker.execute(sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)), 0.0)
    done = run(sched, bm, worker=worker)
    assert sorted(d.request_id for d in done) == ["a", "b"]
    assert bm.num_requests() == 0 and bm.num_free_blocks(W) == 64 and bm.check_invariants() == []


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30)), min_size=1, max_size=8),
    num_blocks=st.integers(12, 48),
    depth=st.integers(1, 3),
    speculate=st.booleans(),
    aborts=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 60)), max_size=3),
)
def test_any_mix_keeps_every_context_and_leaks_no_block(
    shapes: list[tuple[int, int]],
    num_blocks: int,
    depth: int,
    speculate: bool,
    aborts: list[tuple[int, int]],
) -> None:
    """Requests sharing prefixes, in pools small enough to preempt, at every pipeline depth, with
    proposals and aborts: every sampled context reads back its own tokens, every request ends as it
    would alone in a large pool (aborted ones a prefix of it), and the pool is whole again."""

    def start(blocks: int, window: int, spec: SpeculativeConfig | None) -> tuple[Scheduler, BlockManager]:
        bm = BlockManager(lease_ttl_s=100.0)
        bm.add_pool(W, blocks, BS)
        limits = SchedulerLimits(
            max_model_len=4096, pipeline_depth=window, max_num_batched_tokens=24, speculative=spec
        )
        sched = Scheduler(limits, eos_token_ids=[0])
        sched.add_worker(W, blocks, BS)
        for i, (prompt_len, max_tokens) in enumerate(shapes):
            prompt = [5, 6, 7, 8, 9, 10, 11, 12][: prompt_len % 9] + [20 + i] * prompt_len
            sched.add_request(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=max_tokens), 0.0)
        return sched, bm

    ref_sched, ref_bm = start(512, 1, None)
    want = {d.request_id: d.completions[0].output_token_ids for d in drive(ref_sched, ref_bm, PoolWorker({}))}
    sched, bm = start(num_blocks, depth, SPEC if speculate else None)
    at: dict[int, list[str]] = {}
    for index, step in aborts:
        if index < len(shapes):
            at.setdefault(step, []).append(f"r{index}")
    done = {d.request_id: d for d in drive(sched, bm, PoolWorker({}), aborts=at)}
    assert sorted(done) == sorted(want)
    for rid, result in done.items():
        got = result.completions[0].output_token_ids
        if result.error_code is not None or result.completions[0].finish_reason == "abort":
            # aborted, or refused once it outgrew this pool (preempted, it no longer fits): cut short
            assert got == want[rid][: len(got)], rid
        else:
            assert got == want[rid], rid
    assert bm.num_requests() == 0 and bm.num_free_blocks(W) == num_blocks and bm.check_invariants() == []
