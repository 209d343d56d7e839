"""A worker lost with its pool in shared memory: the scheduler and block-manager cores resume its requests.

The worker here keeps a real pool (slot -> value, surviving its "crash" like a segment does) and
samples each token from the KV it *reads back through the block table*: a request resumed with a
wrong table, a slot counted as computed that no step wrote, or a block shared too early gives another
token than the fault-free run, and a slot never written raises.
"""

from __future__ import annotations

import pytest

from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.services.scheduler.request import Status
from pagedserve.services.scheduler.scheduler import RequestDone, Scheduler, SchedulerLimits
from pagedserve.shared.lora_modules import LoRAModule
from pagedserve.shared.protocol.blocks import Free, Resume, Resumption
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import Execute, Speculated, StepResult
from pagedserve.shared.speculative_config import SpeculativeConfig

W = "w0"
BS = 4


class Crash(Exception):
    pass


class PoolWorker:
    def __init__(self, pool: dict[int, int], crash_after_writes: int | None = None) -> None:
        self.pool = pool  # survives a crash: the segment
        self.state: dict[str, tuple[list[int], list[int], list[int]]] = {}  # tokens, blocks, [computed]
        self.writes_left = crash_after_writes

    def slot(self, blocks: list[int], p: int) -> int:
        return blocks[p // BS] * BS + p % BS

    def execute(self, ex: Execute) -> StepResult:
        for rid in ex.finished_ids:
            self.state.pop(rid, None)
        for r in ex.new_requests:
            self.state[r.request_id] = (list(r.token_ids), list(r.block_ids), [r.num_computed_tokens])
        for c in ex.cached_requests:
            blocks = self.state[c.request_id][1]
            blocks += c.new_block_ids
            for index, block in c.replaced_blocks:
                blocks[index] = block
        for src, dst in ex.copies:
            for i in range(BS):
                if src * BS + i in self.pool:
                    self.pool[dst * BS + i] = self.pool[src * BS + i]
        scheduled = [(r.request_id, r.num_scheduled_tokens) for r in ex.new_requests]
        scheduled += [(r.request_id, r.num_scheduled_tokens) for r in ex.cached_requests]
        lookahead = {r.request_id: r.num_lookahead for r in ex.cached_requests if r.num_lookahead}
        for rid, n in scheduled:  # every K/V write first, as the model does layer by layer
            tokens, blocks, computed = self.state[rid]
            for p in range(computed[0], computed[0] + n):
                if self.writes_left is not None:
                    if self.writes_left == 0:
                        raise Crash
                    self.writes_left -= 1
                self.pool[self.slot(blocks, p)] = tokens[p] * 1000 + p
        ids, toks, more = [], [], []
        for rid, n in scheduled:
            tokens, blocks, computed = self.state[rid]
            computed[0] += n
            if computed[0] == len(tokens):
                context = [self.pool[self.slot(blocks, p)] for p in range(len(tokens))]
                assert context == [t * 1000 + p for p, t in enumerate(tokens)], f"{rid}: KV is not its tokens"
                tok = next_token(context)
                tokens.append(tok)
                if rid in lookahead:
                    extra = self.speculate(rid, lookahead[rid])
                    more.append(Speculated(len(ids), lookahead[rid], extra))
                ids.append(rid)
                toks.append(tok)
        return StepResult(ex.step, ids, toks, speculation=more)

    def speculate(self, rid: str, proposals: int) -> list[int]:
        """A decode verifying `proposals` proposed tokens: the K/V of each is written (slots past the
        decode's), the first `accepted` were the right tokens, the others wrong (their slots hold
        garbage, to be written again). Returns the tokens after the first: the accepted proposals'
        successors."""
        tokens, blocks, computed = self.state[rid]
        accepted = (len(tokens) * 7) % (proposals + 1)
        out = []
        for j in range(proposals):
            p = computed[0] + j
            if self.writes_left is not None:
                if self.writes_left == 0:
                    raise Crash
                self.writes_left -= 1
            self.pool[self.slot(blocks, p)] = tokens[p] * 1000 + p if j < accepted else -1
            if j < accepted:
                out.append(next_token([self.pool[self.slot(blocks, q)] for q in range(p + 1)]))
                tokens.append(out[-1])
        computed[0] += accepted
        return out


def next_token(context: list[int]) -> int:
    return sum((i + 1) * v for i, v in enumerate(context)) % 89 + 10


SPEC = SpeculativeConfig(num_speculative_tokens=3, max_step_rows=64, row_cost=0.0)


def setup(
    depth: int = 2,
    budget: int = 24,
    num_blocks: int = 96,
    spec: SpeculativeConfig | None = None,
    loras: list[LoRAModule | None] | None = None,
) -> tuple[Scheduler, BlockManager]:
    """Eight requests sharing a prefix; `loras`: each one's adapter (then the worker holds two at once)."""
    bm = BlockManager(lease_ttl_s=100.0)
    bm.add_pool(W, num_blocks, BS)
    limits = SchedulerLimits(
        max_model_len=4096,
        pipeline_depth=depth,
        max_num_batched_tokens=budget,
        speculative=spec,
        max_loras=0 if loras is None else 2,
    )
    sched = Scheduler(limits, eos_token_ids=[0])
    sched.add_worker(W, num_blocks, BS)
    shared = [5, 6, 7, 8, 9, 10, 11, 12]  # two full blocks every prompt starts with: prefix-cache hits
    for i in range(8):
        sched.add_request(
            f"r{i}",
            shared + [20 + i] * (3 + 5 * i),
            SamplingParams(temperature=0, max_tokens=12),
            0.0,
            lora=None if loras is None else loras[i],
        )
    return sched, bm


def drive(
    sched: Scheduler,
    bm: BlockManager,
    worker: PoolWorker,
    done: list[RequestDone] | None = None,
    aborts: dict[int, list[str]] | None = None,
) -> list[RequestDone]:
    """Run steps with the window kept full, into `done` (requests refused as too large for the pool
    too); a Crash leaves the steps in flight unanswered. `aborts`: the request ids aborted before the
    step of that number is planned."""
    done = [] if done is None else done
    aborts = dict(aborts or {})
    inflight: list[Execute] = []
    step = 0
    while True:
        for rid in aborts.pop(step, []):
            done += [e for e in sched.abort(rid) if isinstance(e, RequestDone)]
        while sched.can_schedule(W):
            plan = sched.schedule(W, 0.0)
            done += [e for e in sched.take_rejected() if isinstance(e, RequestDone)]
            if plan.idle:
                break
            ex = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
            if ex is None:
                if plan.entries:
                    break
                continue
            inflight.append(ex)
        if not inflight:
            if not aborts:
                break
            step = min(aborts)  # nothing runs until the next abort: take it now
            continue
        result = worker.execute(inflight.pop(0))  # may raise Crash: the rest stay in flight, lost
        done += [e for e in sched.on_step_result(W, result, 0.0) if isinstance(e, RequestDone)]
        step += 1
    return done


def outputs(done: list[RequestDone]) -> dict[str, list[int]]:
    return {d.request_id: d.completions[0].output_token_ids for d in done}


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    sched, bm = setup()
    return outputs(drive(sched, bm, PoolWorker({})))


def finish(sched: Scheduler, bm: BlockManager, worker: PoolWorker) -> list[RequestDone]:
    done = drive(sched, bm, worker)
    plan = sched.schedule(W, 0.0)  # the frees of the last results
    if not plan.idle:
        sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
    return done


@pytest.mark.parametrize("crash_at_write", [3, 40, 97, 180, 250])
def test_a_worker_killed_mid_write_resumes_every_request_exactly_with_nothing_recomputed(
    reference, crash_at_write
):
    sched, bm = setup()
    pool: dict[int, int] = {}
    done: list[RequestDone] = []
    with pytest.raises(Crash):
        drive(sched, bm, PoolWorker(pool, crash_after_writes=crash_at_write), done)
    out = sched.suspend_worker(W, 1.0, "epoch-a", "incarnation-1")
    bm.apply(out.frees, 1.0)
    assert not sched.can_schedule(W)  # nothing is planned for a worker that is not there
    for req in out.parked:
        assert req.resume and req.num_slots_used == req.num_committed > 0 and req.in_flight == 0
    assert sched.resume_worker(W, "epoch-a", "incarnation-2", continued=True) == len(out.parked)
    done += finish(sched, bm, PoolWorker(pool))  # the restarted worker: same pool, no request state
    assert outputs(done) == reference
    assert sched.stats.recomputed_tokens == 0
    assert sched.stats.resumed_requests == len(out.parked)
    assert bm.num_free_blocks(W) == 96 and bm.check_invariants() == []


@pytest.mark.parametrize("crash_at_write", [60, 140, 230])
def test_speculating_requests_resume_from_their_accepted_tokens_only(reference, crash_at_write):
    # Proposals' slots are written by the step that verifies them; the rejected ones hold garbage and
    # must not count as committed: a resumed request that trusted them would read -1 from its KV.
    sched, bm = setup(spec=SPEC)
    pool: dict[int, int] = {}
    done: list[RequestDone] = []
    with pytest.raises(Crash):
        drive(sched, bm, PoolWorker(pool, crash_after_writes=crash_at_write), done)
    assert sched.stats.spec_proposed > sched.stats.spec_accepted > 0  # some accepted, some rejected
    out = sched.suspend_worker(W, 1.0, "epoch-a", "incarnation-1")
    bm.apply(out.frees, 1.0)
    assert out.parked
    assert sched.resume_worker(W, "epoch-a", "incarnation-2", continued=True) == len(out.parked)
    done += finish(sched, bm, PoolWorker(pool))
    assert outputs(done) == reference
    assert sched.stats.recomputed_tokens == 0
    assert bm.num_free_blocks(W) == 96 and bm.check_invariants() == []


class AdapterCheckingWorker(PoolWorker):
    """A PoolWorker that holds every request it is sent to the adapter it was queued with."""

    def __init__(
        self,
        pool: dict[int, int],
        adapters: dict[str, LoRAModule | None],
        crash_after_writes: int | None = None,
    ) -> None:
        super().__init__(pool, crash_after_writes)
        self.adapters = adapters
        self.sent: list[str] = []

    def execute(self, ex: Execute) -> StepResult:
        for r in ex.new_requests:
            lora = self.adapters[r.request_id]
            expected = (None, None) if lora is None else (lora.name, lora.path)
            assert (r.lora_name, r.lora_path) == expected, r.request_id
            self.sent.append(r.request_id)
        return super().execute(ex)


def test_a_resumed_request_is_sent_with_its_adapter() -> None:
    # The restarted worker knows no request: one that resumed without its adapter's name and path
    # went on under the base weights over KV computed under the adapter (tests/chaos/test_lora_worker_kill).
    lora = {"a": LoRAModule("a", "/adapters/a", "a#1"), "b": LoRAModule("b", "/adapters/b", "b#1")}
    adapters = {f"r{i}": [lora["a"], lora["b"], None][i % 3] for i in range(8)}
    sched, bm = setup(loras=list(adapters.values()))
    pool: dict[int, int] = {}
    with pytest.raises(Crash):
        drive(sched, bm, AdapterCheckingWorker(pool, adapters, crash_after_writes=97))
    out = sched.suspend_worker(W, 1.0, "epoch-a", "incarnation-1")
    bm.apply(out.frees, 1.0)
    assert any(req.lora is not None for req in out.parked)
    assert sched.resume_worker(W, "epoch-a", "incarnation-2", continued=True) == len(out.parked)
    restarted = AdapterCheckingWorker(pool, adapters)
    finish(sched, bm, restarted)
    assert {req.request_id for req in out.parked} <= set(restarted.sent)
    assert sched.stats.resumed_requests == len(out.parked)


def test_requests_whose_first_step_died_start_again_and_the_rest_resume(reference):
    sched, bm = setup(budget=200)  # the first step admits all eight
    pool: dict[int, int] = {}
    with pytest.raises(Crash):
        drive(sched, bm, PoolWorker(pool, crash_after_writes=20))  # inside the very first step
    out = sched.suspend_worker(W, 1.0, "e", "i1")
    assert not out.parked and len(out.moved) == 8  # nothing committed: nothing to resume
    assert all(r.status is Status.WAITING for r in out.moved)
    bm.apply(out.frees, 1.0)
    # Their pending prefix keys left the cache with them: no later request hits KV nobody wrote.
    assert bm.num_cached_blocks() == 0
    assert sched.resume_worker(W, "e", "i2", continued=True) == 0
    assert outputs(finish(sched, bm, PoolWorker(pool))) == reference


def test_back_without_its_pool_the_requests_recompute_and_that_is_counted(reference):
    sched, bm = setup()
    done: list[RequestDone] = []
    with pytest.raises(Crash):
        drive(sched, bm, PoolWorker({}, crash_after_writes=150), done)
    out = sched.suspend_worker(W, 1.0, "e", "i1")
    bm.apply(out.frees, 1.0)
    # A new process announces a fresh segment (another epoch): nothing to resume on.
    assert sched.resume_worker(W, "other-epoch", "i2", continued=False) is None
    held = sched.live_request_ids(W)
    sched.remove_worker(W)
    bm.apply([Free(rid, 0) for rid in held], 1.0)
    bm.remove_pool(W)
    bm.add_pool(W, 96, BS)
    sched.add_worker(W, 96, BS)
    done += finish(sched, bm, PoolWorker({}))
    assert outputs(done) == reference
    assert sched.stats.recomputed_tokens > 0 and sched.stats.resumed_requests == 0


@pytest.mark.parametrize(
    ("epoch", "incarnation", "continued", "resumes"),
    [
        ("e", "i1", False, True),  # the same process, back from a pause: its pool never went away
        ("e", "i2", True, True),  # a restart that mapped the segment, continued by the block manager
        ("e", "i2", False, False),  # a restart the block manager did not continue (it dropped the tables)
        ("f", "i2", True, False),  # another segment
    ],
)
def test_only_the_pool_the_requests_wait_for_resumes_them(epoch, incarnation, continued, resumes):
    sched, bm = setup()
    with pytest.raises(Crash):
        drive(sched, bm, PoolWorker({}, crash_after_writes=60))
    sched.suspend_worker(W, 1.0, "e", "i1")
    assert (sched.resume_worker(W, epoch, incarnation, continued) is not None) is resumes
    assert sched.is_suspended(W) is not resumes


def test_resume_op_rewinds_the_table_and_drops_pending_keys_past_the_committed_slots():
    bm = BlockManager(lease_ttl_s=100.0)
    bm.add_pool(W, 16, BS)
    prompt = list(range(1, 11))  # 10 tokens: blocks 0, 1 full (keyed), 2 partial
    alloc = bm.allocate(W, "a", "owner", prompt, 10, 0.0)
    assert alloc is not None and bm.num_cached_blocks() == 2
    # The step that computed slots 4.. died: only 4 were committed.
    growth = bm.resume("a", 4, 6, [], 1.0)
    assert growth is not None and bm.table("a") == alloc.block_ids
    assert bm.num_cached_blocks() == 1  # block 1's key was pending on us and its KV may be unwritten
    # Decodes within its blocks were never told: slots past the told ones, up to the blocks held, resume.
    assert bm.resume("a", 11, 1, [], 1.0) is not None and bm.table("a") == alloc.block_ids
    with pytest.raises(ValueError, match="cannot resume at 20 slots, its blocks hold 12"):
        bm.resume("a", 20, 0, [], 1.0)
    assert bm.apply([Resume("a", 10, 1, [77])], 1.0).results == [Resumption(alloc.block_ids, [])]
    assert bm.free("a") == 3 and bm.check_invariants() == []
