"""The scheduler core driven step by step against the real block-manager core.

The "worker" here is the Execute/StepResult contract played by the test: it answers each request
that samples with a token derived from its length, so the policy can be checked without a model.
"""

from __future__ import annotations

from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.services.scheduler.request import Status
from pagedserve.services.scheduler.scheduler import RequestDone, Scheduler, SchedulerLimits
from pagedserve.shared.protocol.blocks import Free
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import Execute, StepResult

W = "w0"


class ScriptedWorker:
    """Tracks known tokens per request exactly as a worker must, and samples a fixed function."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}

    def execute(self, ex: Execute) -> StepResult:
        for rid in ex.finished_ids:
            self.tokens.pop(rid, None)
        ids, toks = [], []
        for r in ex.new_requests:
            self.tokens[r.request_id] = list(r.token_ids)
            self.computed[r.request_id] = r.num_computed_tokens
        sched = [(r.request_id, r.num_scheduled_tokens) for r in ex.new_requests] + [
            (r.request_id, r.num_scheduled_tokens) for r in ex.cached_requests
        ]
        for rid, n in sched:
            self.computed[rid] += n
            assert self.computed[rid] <= len(self.tokens[rid]) + 0, "scheduled past the known tokens"
            if self.computed[rid] == len(self.tokens[rid]):
                tok = (len(self.tokens[rid]) * 7) % 100 + 10
                self.tokens[rid].append(tok)
                ids.append(rid)
                toks.append(tok)
        for f in ex.forks:
            self.tokens[f.child_id] = self.tokens[f.parent_id][:-1]
            self.computed[f.child_id] = self.computed[f.parent_id]
            tok = 200 + len(f.child_id)
            self.tokens[f.child_id].append(tok)
            ids.append(f.child_id)
            toks.append(tok)
        return StepResult(ex.step, ids, toks)


def make(num_blocks: int = 64, block_size: int = 8, **limits) -> tuple[Scheduler, BlockManager]:
    bm = BlockManager(lease_ttl_s=100.0)
    bm.add_pool(W, num_blocks, block_size)
    sched = Scheduler(SchedulerLimits(max_model_len=4096, **limits), eos_token_ids=[0])
    sched.add_worker(W, num_blocks, block_size)
    return sched, bm


def run(
    sched: Scheduler,
    bm: BlockManager,
    now: float = 0.0,
    max_steps: int = 10_000,
    worker: ScriptedWorker | None = None,
) -> list:
    worker = worker or ScriptedWorker()
    results, done = [], []
    for _ in range(max_steps):
        while sched.can_schedule(W):
            plan = sched.schedule(W, now)
            if plan.idle:
                break
            ex = sched.commit(plan, bm.apply(plan.block_ops, now), now)
            if ex is None:
                if plan.entries:
                    break
                continue
            results.append(worker.execute(ex))
        if not results:
            break
        done += [e for e in sched.on_step_result(W, results.pop(0), now) if isinstance(e, RequestDone)]
    # one more plan sends the frees of the last results
    plan = sched.schedule(W, now)
    if not plan.idle:
        sched.commit(plan, bm.apply(plan.block_ops, now), now)
    return done


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def test_every_request_finishes_and_the_pool_is_whole_again():
    sched, bm = make()
    for i in range(10):
        sched.add_request(f"r{i}", list(range(1, 5 + 3 * i)), greedy(5 + i), 0.0)
    done = run(sched, bm)
    assert sorted(d.request_id for d in done) == sorted(f"r{i}" for i in range(10))
    assert all(len(d.completions[0].output_token_ids) == 5 + int(d.request_id[1:]) for d in done)
    assert bm.num_free_blocks(W) == 64 and bm.check_invariants() == []


def test_token_budget_splits_a_long_prompt_into_chunks():
    sched, bm = make(max_num_batched_tokens=16)
    sched.add_request("long", list(range(1, 60)), greedy(2), 0.0)
    plan = sched.schedule(W, 0.0)
    ex = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
    assert ex.new_requests[0].num_scheduled_tokens == 16
    plan = sched.schedule(W, 0.0)
    ex = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
    assert [c.num_scheduled_tokens for c in ex.cached_requests] == [16]


def test_decodes_are_scheduled_before_waiting_prompts():
    sched, bm = make(max_num_batched_tokens=8, pipeline_depth=1)
    sched.add_request("a", [1, 2, 3], greedy(10), 0.0)
    worker = ScriptedWorker()
    plan = sched.schedule(W, 0.0)
    ex = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
    sched.on_step_result(W, worker.execute(ex), 0.0)
    sched.add_request("b", list(range(1, 40)), greedy(3), 0.0)
    plan = sched.schedule(W, 0.0)
    ex = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
    assert [c.request_id for c in ex.cached_requests] == ["a"]  # the decode took its one token first
    assert ex.new_requests[0].request_id == "b" and ex.new_requests[0].num_scheduled_tokens == 7


def test_request_older_than_aging_s_is_scheduled_before_newer_ones():
    sched, bm = make(max_num_seqs=1, aging_s=5.0)
    sched.add_request("old-low", [1, 2, 3], greedy(1, priority=0), now=0.0)
    sched.add_request("new-high", [1, 2, 3], greedy(1, priority=1), now=5.5)
    # At t=6 the old one has waited 6 s: one aging step lifts it level with the newer, and it arrived first.
    plan = sched.schedule(W, 6.0)
    assert [e.request.request_id for e in plan.entries] == ["old-low"]


def test_explicit_priority_wins_before_aging_applies():
    sched, bm = make(max_num_seqs=1, aging_s=5.0)
    sched.add_request("old-low", [1, 2, 3], greedy(1, priority=0), now=0.0)
    sched.add_request("new-high", [1, 2, 3], greedy(1, priority=1), now=1.0)
    plan = sched.schedule(W, 2.0)
    assert [e.request.request_id for e in plan.entries] == ["new-high"]


def test_pipeline_keeps_depth_steps_in_flight_and_decodes_run_ahead():
    sched, bm = make(pipeline_depth=2)
    sched.add_request("a", [1, 2, 3, 4], greedy(5), 0.0)
    plans = []
    for _ in range(2):
        plan = sched.schedule(W, 0.0)
        plans.append(sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0))
    assert not sched.can_schedule(W)  # window full
    assert plans[1].cached_requests[0].num_scheduled_tokens == 1  # decode built before step 0's token


def test_tokens_past_a_stop_are_dropped_and_blocks_freed_only_after_the_last_step():
    sched, bm = make(pipeline_depth=3)
    sched.add_request("a", [1, 2, 3], greedy(2), 0.0)  # stops by length after 2 tokens
    worker = ScriptedWorker()
    exes = []
    for _ in range(3):
        if not sched.can_schedule(W):
            break
        plan = sched.schedule(W, 0.0)
        ex = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
        exes.append(ex)
    assert len(exes) == 2  # max_tokens=2: no third decode is even scheduled
    sched.on_step_result(W, worker.execute(exes[0]), 0.0)
    events = sched.on_step_result(W, worker.execute(exes[1]), 0.0)
    done = [e for e in events if isinstance(e, RequestDone)]
    assert done and len(done[0].completions[0].output_token_ids) == 2
    assert bm.table("a") is not None  # the free goes out with the next plan
    plan = sched.schedule(W, 0.0)
    assert Free("a", 4) in plan.block_ops  # its computed slots: 3 prompt tokens + 1 decode input


def test_stop_token_ends_request_and_pipelined_extra_token_is_dropped():
    sched, bm = make(pipeline_depth=2)
    # ScriptedWorker's first token for a 3-token prompt is (3*7)%100+10 = 31.
    sched.add_request("a", [1, 2, 3], greedy(10, stop_token_ids=[31]), 0.0)
    done = run(sched, bm)
    assert done[0].completions[0].output_token_ids == [31]
    assert done[0].completions[0].finish_reason == "stop"
    assert bm.num_free_blocks(W) == 64


def test_small_pool_preempts_the_newest_and_everything_still_finishes():
    sched, bm = make(num_blocks=12, block_size=8, pipeline_depth=2)
    for i in range(6):
        sched.add_request(f"r{i}", list(range(1, 10)), greedy(30), float(i))
    done = run(sched, bm)
    assert len(done) == 6
    assert sched.stats.preemptions > 0
    assert all(len(d.completions[0].output_token_ids) == 30 for d in done)
    assert bm.num_free_blocks(W) == 12 and bm.check_invariants() == []


def test_preempted_request_recomputes_to_the_same_tokens():
    big, bm1 = make(num_blocks=200)
    small, bm2 = make(num_blocks=12)
    for s in (big, small):
        for i in range(6):
            s.add_request(f"r{i}", list(range(1, 10 + i)), greedy(25), float(i))
    a = {d.request_id: d.completions[0].output_token_ids for d in run(big, bm1)}
    b = {d.request_id: d.completions[0].output_token_ids for d in run(small, bm2)}
    assert small.stats.preemptions > 0 and a == b


def test_n3_forks_share_the_prompt_blocks():
    sched, bm = make(block_size=8)
    sched.add_request("p", list(range(1, 21)), greedy(4, n=3), 0.0)
    plan = sched.schedule(W, 0.0)
    ex = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
    assert [f.child_id for f in ex.forks] == ["p#1", "p#2"]
    tables = [bm.table(r) for r in ("p", "p#1", "p#2")]
    assert tables[0] == tables[1] == tables[2]
    snap = bm.snapshot(0.0)
    refs = {b["id"]: b["ref_count"] for b in snap["pools"][0]["blocks"]}
    assert all(refs[b] == 3 for b in tables[0])


def test_n3_finishes_with_three_completions_and_frees_everything():
    sched, bm = make(block_size=8)
    sched.add_request("p", list(range(1, 21)), greedy(6, n=3), 0.0)
    done = run(sched, bm)
    assert len(done) == 1 and [c.index for c in done[0].completions] == [0, 1, 2]
    assert all(len(c.output_token_ids) == 6 for c in done[0].completions)
    assert bm.num_free_blocks(W) == 64 and bm.check_invariants() == []


def test_abort_frees_blocks_after_in_flight_steps():
    sched, bm = make(pipeline_depth=2)
    sched.add_request("a", list(range(1, 30)), greedy(50), 0.0)
    worker = ScriptedWorker()
    exes = []
    for _ in range(2):
        plan = sched.schedule(W, 0.0)
        exes.append(sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0))
    events = sched.abort("a")
    assert any(isinstance(e, RequestDone) for e in events)
    for ex in exes:
        sched.on_step_result(W, worker.execute(ex), 0.0)
    plan = sched.schedule(W, 0.0)
    sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
    assert bm.table("a") is None and bm.num_free_blocks(W) == 64


def test_removed_worker_requeues_its_requests_with_their_tokens():
    sched, bm = make(pipeline_depth=1)
    sched.add_request("a", [1, 2, 3], greedy(10), 0.0)
    worker = ScriptedWorker()
    for _ in range(3):
        plan = sched.schedule(W, 0.0)
        sched.on_step_result(W, worker.execute(sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)), 0.0)
    req = sched.requests["a"]
    assert len(req.output_token_ids) == 3
    sched.remove_worker(W)
    assert req.status is Status.WAITING and req.num_slots_used == 0 and len(sched.placement.orphans) == 1
    sched.add_worker("w1", 64, 8)
    assert req.worker_id == "w1" and len(sched.placement.workers["w1"].waiting) == 1


def test_deadline_without_workers_ends_with_no_workers():
    sched = Scheduler(SchedulerLimits(), eos_token_ids=[0])
    sched.add_request("a", [1, 2], greedy(3), 0.0, deadline=1.0)
    assert sched.expire(0.5) == []
    events = sched.expire(1.5)
    assert [e.error_code for e in events if isinstance(e, RequestDone)] == ["no_workers"]
    assert not sched.has_unfinished()
