"""A step whose block-manager answer is still out: the service reads its sockets meanwhile, so aborts,
step results and lost workers land between a plan and its commit. None of them may leak a table,
lose a request, or let a stale answer change a worker that has moved on."""

from __future__ import annotations

import pytest
from test_scheduler_core import ScriptedWorker, W, greedy, make, run

from pagedserve.services.scheduler.scheduler import RequestDone
from pagedserve.shared.protocol.blocks import Free, Grow, OpError


def test_a_worker_with_a_plan_out_gets_no_other_until_its_answer():
    sched, bm = make()
    sched.add_request("a", [1, 2, 3], greedy(4), 0.0)
    plan, events = sched.begin_step(W, 0.0)
    assert plan is not None and events == []
    sched.add_request("b", [4, 5, 6], greedy(4), 0.0)
    assert not sched.can_schedule(W)
    outcome = sched.finish_step(plan, bm.apply(plan.block_ops, 0.0), 0.0)
    assert outcome.execute is not None and [r.request_id for r in outcome.execute.new_requests] == ["a"]
    assert sched.can_schedule(W)  # b waits; the window has room


def test_a_request_aborted_while_its_alloc_is_out_leaves_no_table():
    sched, bm = make()
    sched.add_request("a", [1, 2, 3, 4, 5], greedy(4, n=2), 0.0)
    plan = sched.schedule(W, 0.0)
    events = sched.abort("a")  # the client hung up: the answer is not back yet
    assert any(isinstance(e, RequestDone) for e in events)
    answers = bm.apply(plan.block_ops, 0.0)  # the parent's table and its fork child are made
    assert bm.num_requests() == 2
    assert sched.commit(plan, answers, 0.0) is None  # nothing to run
    assert sched.can_schedule(W)
    frees = sched.schedule(W, 0.0).block_ops
    assert set(frees) == {Free("a", 0), Free("a#1", 0)}
    bm.apply(frees, 0.0)
    assert bm.num_requests() == 0 and bm.num_free_blocks(W) == 64 and bm.check_invariants() == []


def test_a_request_that_stops_while_its_grow_is_out_is_freed_with_its_computed_slots():
    sched, bm = make()
    worker = ScriptedWorker()
    sched.add_request("a", [1, 2, 3], greedy(5, stop_token_ids=[31]), 0.0)  # the worker samples 31 first
    plan = sched.schedule(W, 0.0)
    first = worker.execute(sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0))
    plan = sched.schedule(W, 0.0)  # pipelined: the decode of step 2 is planned before step 1 answers
    assert plan.entries
    done = [e for e in sched.on_step_result(W, first, 0.0) if isinstance(e, RequestDone)]
    assert [d.request_id for d in done] == ["a"]  # stopped while the grow is out
    sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
    frees = sched.schedule(W, 0.0).block_ops
    assert Free("a", 3) in frees  # the grown slot was never computed: it is not offered to the cache
    bm.apply(frees, 0.0)
    assert bm.num_requests() == 0 and bm.num_free_blocks(W) == 64 and bm.check_invariants() == []


def test_a_worker_lost_while_its_plan_is_out_frees_what_the_batch_makes_and_requeues_its_requests():
    sched, bm = make()
    sched.add_request("a", [1, 2, 3, 4, 5], greedy(4), 0.0)
    plan = sched.schedule(W, 0.0)
    held = sched.live_request_ids(W)
    assert held == ["a"]  # not yet computed, but the batch out makes its table
    moved = sched.remove_worker(W)
    assert [r.request_id for r in moved] == ["a"]
    answers = bm.apply(plan.block_ops, 0.0)  # the batch lands first, then the frees sent after it
    bm.apply([Free(rid, 0) for rid in held], 0.0)
    sched.add_worker(W, 64, 8)  # back, under the same name
    assert sched.commit(plan, answers, 0.0) is None  # a stale answer changes nothing
    plan = sched.schedule(W, 0.0)
    ex = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
    assert ex is not None and [r.request_id for r in ex.new_requests] == ["a"]
    assert bm.num_requests() == 1 and bm.check_invariants() == []


def test_a_worker_suspended_while_its_plan_is_out_frees_the_tables_the_batch_makes():
    sched, bm = make()
    sched.add_request("a", [1, 2, 3, 4, 5], greedy(4), 0.0)
    plan = sched.schedule(W, 0.0)
    out = sched.suspend_worker(W, 0.0, "epoch-1", "inc-1")
    assert Free("a", 0) in out.frees and [r.request_id for r in out.moved] == ["a"]
    answers = bm.apply(plan.block_ops, 0.0)
    bm.apply(out.frees, 0.0)
    assert sched.commit(plan, answers, 0.0) is None
    assert bm.num_requests() == 0 and bm.num_free_blocks(W) == 64


@pytest.mark.parametrize("newcomer", [False, True])
def test_a_grow_refused_for_a_table_the_block_manager_dropped_recomputes_instead_of_starving(newcomer: bool):
    """The drop is found by the first batch after it: a decode that needs a block (a prompt of 8 fills
    its block), or, for a decode within its block (a prompt of 3), whatever else the batch carries (a
    newcomer's alloc, which could take those very blocks)."""
    prompt = [1, 2, 3] if newcomer else [1, 2, 3, 4, 5, 6, 7, 8]
    clean_sched, clean_bm = make()
    clean_sched.add_request("a", prompt, greedy(6), 0.0)
    (want,) = run(clean_sched, clean_bm)
    sched, bm = make()
    sched.add_request("a", prompt, greedy(6), 0.0)
    plan = sched.schedule(W, 0.0)
    worker = ScriptedWorker()
    sched.on_step_result(W, worker.execute(sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)), 0.0)
    bm.remove_pool(W)  # it thought the worker silent (it was paused itself) and dropped the pool
    bm.add_pool(W, 64, 8)
    if newcomer:
        sched.add_request("b", [9, 9, 9], greedy(2), 0.0)
    plan = sched.schedule(W, 0.0)
    refused = bm.apply(plan.block_ops, 0.0)
    (a_op,) = [i for i, op in enumerate(plan.block_ops) if isinstance(op, Grow) and op.request_id == "a"]
    assert isinstance(refused.results[a_op], OpError)
    execute = sched.commit(plan, refused, 0.0)  # a does not run: it goes back...
    assert execute is None or execute.request_ids() == ["b"]
    if execute is not None:
        sched.on_step_result(W, worker.execute(execute), 0.0)
    done = {d.request_id: d for d in run(sched, bm, worker=worker)}  # ... and is computed again
    assert done["a"].completions[0].output_token_ids == want.completions[0].output_token_ids
    assert bm.num_requests() == 0 and bm.num_free_blocks(W) == 64 and bm.check_invariants() == []
