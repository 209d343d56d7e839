"""A decode within the blocks its request holds sends the block manager nothing: at one request 15 steps
of 16 need no batch at all. The table catches up with the next grow or free, so the block manager ends
with the slots, tokens and prefix-cache blocks it would have had if every step had been told."""

from __future__ import annotations

from test_scheduler_core import ScriptedWorker, W, greedy, make, run

from pagedserve.shared.protocol.blocks import Alloc, Free, Grow


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
