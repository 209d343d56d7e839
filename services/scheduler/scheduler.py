"""The scheduler core: who runs in each step, under a token budget, with memory from the block manager.

No sockets and no clock of its own (`now` is passed in). One step for one worker goes:

    plan = scheduler.schedule(worker_id, now)       # decides, and lists the block-manager ops
    reply = <block manager>.apply(plan.block_ops)   # ONE batched RPC (or a direct call in-process)
    execute = scheduler.commit(plan, reply, now)    # -> the Execute message for the worker
    ... later ...
    events = scheduler.on_step_result(worker_id, step_result, now)

The service sends the batch and goes on reading its sockets: results of the worker's steps in
flight, aborts and deadlines may all land before the answer, and `commit` takes each entry as it
finds it then. Until then the plan is the worker's `planned` one and it gets no other.
`begin_step` / `finish_step` are the two halves as the service uses them; `step_once` runs both
around a direct call (the in-process engine). A decode within the blocks its request holds has no op
(PlanEntry.op_index): a plan of those alone has an empty batch and needs no block manager.

Up to `pipeline_depth` steps per worker are in flight: step N+1 is planned before N's tokens are
known (the worker feeds a decode its own last sampled token). Blocks of a finished or preempted
request are freed only once no step in flight names it: the worker may still be writing them.

The parts, one file each: planning.py (who runs), placement.py (on which worker), forks.py (n > 1),
outputs.py (tokens -> text, stops, events). This file keeps the request book and the commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.scheduler.forks import adopt_child, all_completions, forked
from pagedserve.services.scheduler.limits import SchedulerLimits, SchedulerStats
from pagedserve.services.scheduler.outputs import OutputEvent, Outputs, RequestDone
from pagedserve.services.scheduler.placement import Placement, WorkerState
from pagedserve.services.scheduler.planning import Planner, StepPlan, schedulable
from pagedserve.services.scheduler.request import Request, Status
from pagedserve.services.scheduler.resumption import Suspension, can_resume, suspend
from pagedserve.services.scheduler.speculation import SpeculationPolicy
from pagedserve.shared.completion_text import Tokenizer
from pagedserve.shared.lora_modules import LoRAModule, LoRARegistry
from pagedserve.shared.protocol.blocks import (
    UNCHANGED,
    Allocation,
    BlockAnswers,
    BlockOp,
    Free,
    Growth,
    OpError,
    Resumption,
)
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.prompt_logprobs import PromptLogprobs
from pagedserve.shared.protocol.step import (
    CachedRequest,
    Execute,
    Fork,
    NewRequest,
    StepResult,
    WorkerSampling,
)

__all__ = ["OutputEvent", "RequestDone", "Scheduler", "SchedulerLimits", "StepOutcome"]

Event = OutputEvent | RequestDone


@dataclass(slots=True)
class StepOutcome:
    """What one `step_once` produced: the step to send (if any) and what the clients should see."""

    execute: Execute | None
    events: list[Event] = field(default_factory=list)
    again: bool = False  # another step may be planned right away


class Scheduler:
    def __init__(
        self,
        limits: SchedulerLimits,
        eos_token_ids: Sequence[int],
        tokenizer: Tokenizer | None = None,
        owner: str = "scheduler",
    ) -> None:
        self.limits = limits
        self.owner = owner  # the lease owner named in alloc and fork ops
        self.stats = SchedulerStats()
        self.placement = Placement(limits.pipeline_depth, limits.aging_s)
        self.outputs = Outputs(tokenizer, eos_token_ids, limits.max_model_len, self.stats)
        self.speculation = SpeculationPolicy(limits.speculative, limits.max_model_len)
        self.planner = Planner(limits, self.stats, self._release, self._reject, self.speculation)
        self.requests: dict[str, Request] = {}  # every completion that is not yet fully released
        self.groups: dict[str, list[Request]] = {}  # client request id -> its completions
        self.rejected: list[Request] = []  # ended at admission (too big for the pool); see take_rejected
        self.loras = LoRARegistry()  # the adapters requests may name (limits.max_loras > 0)

    # ------------------------------------------------------------------ workers

    def add_worker(self, worker_id: str, num_blocks: int, block_size: int) -> None:
        if worker_id in self.placement.workers:
            self.remove_worker(worker_id)
        self.placement.add(worker_id, num_blocks, block_size)

    def remove_worker(self, worker_id: str) -> list[Request]:
        """The worker is gone, and its pool with it: everything it held is recomputed elsewhere.

        Tokens already streamed stay; a recompute prefills prompt + outputs, so the client's stream
        continues without a gap or a repeat."""
        state = self.placement.remove(worker_id)
        if state is None:
            return []
        moved: list[Request] = []
        for req in [r for r in self.requests.values() if r.worker_id == worker_id]:
            if req.status is Status.FINISHED:
                self._release(req)
                continue
            if req.status is Status.WAITING:
                state.waiting.remove(req)
            elif req.status is Status.RUNNING:
                req.lost_committed = req.num_committed  # computed again once it is admitted elsewhere
            req.reset_to_waiting()
            moved.append(req)
        self._requeue(moved)
        return moved

    def suspend_worker(self, worker_id: str, now: float, pool_epoch: str, incarnation: str) -> Suspension:
        """The worker is gone but its pool lives on (shared memory): its running requests wait for it
        to come back and resume (resumption.py); the rest move now. Returns the frees to send."""
        state = self.placement.workers[worker_id]
        held = [r for r in self.requests.values() if r.worker_id == worker_id]
        abandoned = self._abandon_plan(state)
        out = suspend(state, held, now, pool_epoch, incarnation)
        out.frees.extend(Free(rid, 0) for rid in abandoned)
        for req in out.released:
            self._release(req)
        self._requeue(out.moved)
        return out

    def is_suspended(self, worker_id: str) -> bool:
        state = self.placement.workers.get(worker_id)
        return state is not None and state.suspended_at is not None

    def suspended_since(self, worker_id: str) -> float | None:
        state = self.placement.workers.get(worker_id)
        return None if state is None else state.suspended_at

    def resume_worker(self, worker_id: str, pool_epoch: str, incarnation: str, continued: bool) -> int | None:
        """The suspended worker is back: with its pool (its parked requests resume; returns how many),
        or not (None: the caller frees their tables and removes the worker, so they recompute)."""
        state = self.placement.workers[worker_id]
        if not can_resume(state, pool_epoch, incarnation, continued):
            return None
        state.suspended_at = None
        state.window = self.placement.new_window()
        self.placement.place_orphans()
        return len(state.running)

    @staticmethod
    def _recompute(req: Request, state: WorkerState) -> None:
        """Back to the waiting queue to compute prompt + outputs again, once no step names it."""
        req.status = Status.PREEMPTED
        if req.in_flight == 0:
            state.running.remove(req)
            state.to_free.append(req)

    @staticmethod
    def _abandon_plan(state: WorkerState) -> list[str]:
        """The worker is lost while its plan's batch is out: the answer will be ignored (its requests
        are still waiting, as far as the book knows), and the tables it may create are returned, to
        be freed by ops sent after that batch."""
        plan, state.planned = state.planned, None
        return [] if plan is None else plan.new_table_ids()

    def _requeue(self, moved: list[Request]) -> None:
        # They arrived before anyone still waiting: back in front, oldest first.
        for req in sorted(moved, key=lambda r: r.arrival, reverse=True):
            self.placement.enqueue(req, front=True)

    def has_worker(self, worker_id: str) -> bool:
        return worker_id in self.placement.workers

    def worker_ids(self) -> list[str]:
        return list(self.placement.workers)

    def expects_result(self, worker_id: str, step: int) -> bool:
        """Is `step` the oldest step in flight on this worker (the only one it may answer now)?"""
        state = self.placement.workers.get(worker_id)
        return state is not None and bool(state.window.steps) and state.window.steps[0].step == step

    def oldest_step_sent_at(self, worker_id: str) -> float | None:
        state = self.placement.workers.get(worker_id)
        return state.window.oldest_sent_at() if state else None

    def set_owner(self, owner: str) -> None:
        """A new lease owner (the block manager lost every table): new ops name it."""
        self.owner = owner

    # ------------------------------------------------------------------ requests

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        now: float,
        deadline: float | None = None,
        tenant: str = "",
        lora: LoRAModule | None = None,
        detokenize: bool = True,
    ) -> None:
        """Queue a validated request on the least-loaded worker (or until one registers). Requests of
        one priority are taken from their tenants in turn (WaitingQueue). `detokenize` False: its
        client makes the text (no text here, no stop strings; StopAt ends a completion)."""
        if request_id in self.groups:
            raise ValueError(f"request_id {request_id!r} is already live")
        req = Request(
            request_id,
            list(prompt_token_ids),
            sampling,
            now,
            "",
            seed=sampling.seed,
            tenant=tenant,
            lora=lora,
            detokenize=detokenize,
            deadline=deadline,
            fork_children=sampling.n - 1,
        )
        self.requests[request_id] = req
        self.groups[request_id] = [req]
        self.outputs.open(req)
        self.stats.prompt_tokens += len(prompt_token_ids)
        self.placement.enqueue(req, front=False)

    def lora_users(self, name: str) -> list[str]:
        """Live requests (client ids) that run with adapter `name`."""
        return sorted(
            rid
            for rid, group in self.groups.items()
            if group[0].lora is not None and group[0].lora.name == name
        )

    def abort(self, request_id: str, reason: str = "abort") -> list[Event]:
        group = self.groups.get(request_id)
        if group is None:
            return []
        events: list[Event] = []
        for req in group:
            if req.status is not Status.FINISHED:
                events.extend(self._finish(req, reason))
        return events + self._done_if_complete(request_id)

    def stop_at(self, request_id: str, index: int, num_tokens: int) -> list[Event]:
        """A client's stop string ended completion `index` at `num_tokens` output tokens: it finishes
        there ("stop"), and what it made past that point is dropped. Nothing when it has ended already,
        or has fewer tokens (recomputed meanwhile: the client says it again when it sees them)."""
        group = self.groups.get(request_id)
        req = next((r for r in group or () if r.index == index), None)
        if req is None or req.status is Status.FINISHED or len(req.output_token_ids) < num_tokens:
            return []
        self.outputs.trim(req, num_tokens)
        return [*self._finish(req, "stop"), *self._done_if_complete(request_id)]

    def expire(self, now: float) -> list[Event]:
        """End requests past their deadline: `no_workers` when nobody could serve them."""
        events: list[Event] = []
        for rid, group in list(self.groups.items()):
            head = group[0]
            if head.deadline is not None and now >= head.deadline:
                # A suspended worker (lost, its pool waiting for it) serves nobody until it is back.
                live = any(w.suspended_at is None for w in self.placement.workers.values())
                code = "timeout" if live else "no_workers"
                for req in group:
                    if req.status is not Status.FINISHED:
                        events.extend(self._finish(req, "error"))
                events.extend(self._done_if_complete(rid, error_code=code))
        return events

    def take_rejected(self) -> list[Event]:
        """Requests that can never fit their worker's pool end with `too_large_for_pool`."""
        events: list[Event] = []
        for req in self.rejected:
            events.extend(
                self._done_if_complete(
                    req.parent_id or req.request_id,
                    error_code="too_large_for_pool",
                    error_message=req.refusal,
                )
            )
        self.rejected.clear()
        return events

    @property
    def num_waiting(self) -> int:
        return self.placement.num_waiting

    @property
    def num_running(self) -> int:
        return self.placement.num_running

    def has_unfinished(self) -> bool:
        return bool(self.groups)

    def is_live(self, request_id: str) -> bool:
        """A client request with a completion still going (its id cannot be reused yet)."""
        return request_id in self.groups

    def completions(self, request_id: str) -> list[Request]:
        """The live completions of a client request (the parent first)."""
        return list(self.groups.get(request_id, ()))

    def emitted_text(self, completion: Request) -> str:
        return self.outputs.emitted_text(completion.request_id)

    def live_requests(self) -> Iterator[Request]:
        return iter(list(self.requests.values()))

    def live_request_ids(self, worker_id: str | None = None) -> list[str]:
        """Ids whose blocks the block manager holds, or will once the batch out is applied (for
        freeing a lost worker's: ops sent after that batch are applied after it)."""
        ids = [
            r.request_id
            for r in self.requests.values()
            if r.num_slots_used > 0 and (worker_id is None or r.worker_id == worker_id)
        ]
        for wid, state in self.placement.workers.items():
            if state.planned is not None and (worker_id is None or wid == worker_id):
                ids.extend(state.planned.new_table_ids())
        return ids

    # ------------------------------------------------------------------ one step

    def can_schedule(self, worker_id: str) -> bool:
        state = self.placement.workers.get(worker_id)
        if state is None or state.suspended_at is not None or not state.window.has_room():
            return False
        if state.planned is not None:
            return False  # its batch is out: the answer commits it first
        if state.to_free or state.stray or len(state.waiting):
            return True
        return any(schedulable(r) for r in state.running)

    def schedule(self, worker_id: str, now: float) -> StepPlan:
        """Plan the worker's next step. A plan with anything to run or free stays the worker's `planned`
        one, and the worker gets no other, until `commit` takes the block manager's answer to it."""
        state = self.placement.workers[worker_id]
        plan = self.planner.plan(state, self.owner, now)
        if not plan.idle:
            state.planned = plan
        return plan

    def begin_step(self, worker_id: str, now: float) -> tuple[StepPlan | None, list[Event]]:
        """Plan a step: the plan whose ops go to the block manager (None: nothing to run or free)
        and what clients should see now (requests that can never fit)."""
        plan = self.schedule(worker_id, now)
        events: list[Event] = list(self.take_rejected())
        if plan.idle:
            # Nothing to run or free: the worker hears of the requests to forget with the next step
            # (dropping them here left their state on the worker for good).
            self.placement.workers[worker_id].forget[:0] = plan.forget
            return None, events
        return plan, events

    def finish_step(self, plan: StepPlan, reply: BlockAnswers, now: float) -> StepOutcome:
        """The block manager answered the plan's batch: the step to send, if any can run."""
        execute = self.commit(plan, reply, now)
        # Nothing ran but memory came back: plan again with it.
        return StepOutcome(execute, again=execute is not None or plan.only_frees)

    def step_once(
        self, worker_id: str, now: float, apply: Callable[[list[BlockOp]], BlockAnswers]
    ) -> StepOutcome:
        """begin -> apply (the block manager, in-process) -> finish, in one call."""
        plan, events = self.begin_step(worker_id, now)
        if plan is None:
            return StepOutcome(None, events)
        outcome = self.finish_step(plan, apply(plan.block_ops), now)
        outcome.events[:0] = events
        return outcome

    def commit(self, plan: StepPlan, reply: BlockAnswers, now: float) -> Execute | None:
        """Apply the block manager's answers (over a socket or in-process); build the Execute (None
        if nothing could run). A plan its worker no longer waits for (lost and perhaps back since)
        is dropped: whatever tables its batch made were freed by ops sent after it."""
        state = self.placement.workers.get(plan.worker_id)
        if state is None or state.planned is not plan:
            return None
        state.planned = None
        results = reply.results
        state.free_blocks = reply.free_blocks.get(plan.worker_id, state.free_blocks)
        execute = Execute(step=-1, finished_ids=plan.forget, prefetch_loras=plan.prefetch)
        sampled_ids: list[str] = []
        lookahead: dict[str, int] = {}
        for entry in plan.entries:
            req = entry.request
            res = UNCHANGED if entry.op_index is None else results[entry.op_index]
            ok = type(res) is (Allocation if entry.new else Resumption if entry.resume else Growth)
            ended = req.status is Status.FINISHED
            if not ended and req.status is not Status.RUNNING and not entry.new:
                continue  # preempted: its free is planned once no step names it
            if ended or not ok:
                if ended:
                    # Ended (an abort, a deadline, a stop) while the batch was out. A table made for
                    # it alone now has no owner in the book; a running one's is freed with it as usual.
                    if entry.new and ok:
                        state.stray.append(req.request_id)
                elif isinstance(res, OpError) and not entry.new:
                    # Its table is not what we hold it to be (the block manager dropped it with a pool
                    # it thought lost): starving would wait forever, so it recomputes, as after a
                    # preemption.
                    self._recompute(req, state)
                elif entry.new:  # no room after all (prefix hits pulled cached blocks): wait in front
                    state.waiting.push_front(req)  # a refused alloc (an OpError) takes the same way
                else:
                    state.starving = True  # None: a full pool
                # A fork of a parent that does not run this step holds blocks nobody will use.
                state.stray.extend(c.request_id for i, c in entry.forks if forked(results[i]))
                continue
            if entry.new:
                assert isinstance(res, Allocation)  # entry.new chose the type above
                req.status = Status.RUNNING
                req.on_worker = True
                req.num_slots_used = req.num_slots_given = res.num_cached_tokens + res.num_new_tokens
                req.num_known_sent = req.num_known
                req.num_cached_tokens = res.num_cached_tokens
                self.stats.cached_tokens += res.num_cached_tokens
                if req.lost_committed:  # its KV died with a worker: this prefill computes it again
                    self.stats.recomputed_tokens += max(0, req.lost_committed - res.num_cached_tokens)
                    req.lost_committed = 0
                state.running.append(req)
                sent = self._to_worker(req, res.num_cached_tokens, res.num_new_tokens, res.block_ids, True)
                execute.new_requests.append(sent)
            elif entry.resume:
                assert isinstance(res, Resumption)  # entry.resume chose it
                execute.new_requests.append(self._resumed(req, entry.num_tokens, res))
                execute.copies.extend(res.copies)
            else:
                assert isinstance(res, Growth)
                req.num_slots_used += entry.num_tokens + entry.lookahead
                if entry.op_index is not None:  # its grow was sent: the table holds these slots and tokens
                    req.num_slots_given = max(req.num_slots_given, req.num_slots_used)
                    req.num_known_sent = req.num_known
                req.shares_last_block = False
                execute.copies.extend(res.copies)
                execute.cached_requests.append(
                    CachedRequest(
                        req.request_id,
                        entry.num_tokens,
                        list(res.new_block_ids),
                        list(res.replaced),
                        entry.lookahead,
                    )
                )
                if entry.lookahead:
                    req.lookahead_in_flight += entry.lookahead
                    lookahead[req.request_id] = entry.lookahead
            req.in_flight += 1
            if req.num_slots_used >= req.num_known:
                req.pending += 1
                sampled_ids.append(req.request_id)
            for op_index, child in entry.forks:
                if not forked(results[op_index]):
                    continue
                adopt_child(req, child)
                self.requests[child.request_id] = child
                self.groups[req.request_id].append(child)
                self.outputs.open(child)
                state.running.append(child)
                execute.forks.append(Fork(req.request_id, child.request_id, child.seed))
                sampled_ids.append(child.request_id)
            if entry.forks:
                req.fork_children = 0
        if not execute.new_requests and not execute.cached_requests:
            state.forget = plan.forget + state.forget
            return None
        step_ids = execute.request_ids() + [f.child_id for f in execute.forks]
        # Lost with this step, a copy-on-write or a fork leaves blocks nobody is sure of.
        unsafe = frozenset(
            [r.request_id for r in execute.cached_requests if r.replaced_blocks]
            + [i for f in execute.forks for i in (f.parent_id, f.child_id)]
        )
        # Counted with the proposals rejected so far: on the result, less those rejected since (this
        # step's among them), it is what the worker wrote (Request.num_committed).
        slots_after = [
            self.requests[rid].num_slots_used + self.requests[rid].num_rejected for rid in step_ids
        ]
        # Only a learned price needs to know which steps were decodes alone (their times price a row).
        decodes_only = self.speculation.learns and not execute.new_requests and not execute.forks
        if decodes_only and all(r.num_scheduled_tokens == 1 for r in execute.cached_requests):
            decode_rows = len(execute.cached_requests)
        else:
            decode_rows = 0
        execute.step = state.window.open(step_ids, now, slots_after, unsafe, lookahead, decode_rows)
        self.stats.account_kv([r.num_slots_used for r in state.running], state.block_size)
        self.stats.steps += 1
        return execute

    def _resumed(self, req: Request, num_tokens: int, res: Resumption) -> NewRequest:
        """A parked request, to the restarted worker that holds its pool: as new, its committed slots
        already computed (their KV is in the pool it mapped again)."""
        committed = req.num_slots_used
        req.num_slots_used += num_tokens
        req.num_slots_given = max(req.num_slots_given, req.num_slots_used)
        req.num_known_sent = req.num_known
        req.on_worker = True
        req.resume = False
        self.stats.resumed_requests += 1
        self.stats.resumed_tokens += committed
        return self._to_worker(req, committed, num_tokens, res.block_ids, False)

    @staticmethod
    def _to_worker(
        req: Request, computed: int, scheduled: int, block_ids: list[int], first_send: bool
    ) -> NewRequest:
        """A request as a worker that does not know it is sent it: new (`first_send`) or resumed, always with
        its adapter (a resumed one sent without it went on under the base weights over KV computed under
        it). Prompt logprobs only on the first send: a resumed request's tally died with the worker."""
        return NewRequest(
            req.request_id,
            req.known_token_ids(),
            len(req.prompt_token_ids),
            computed,
            scheduled,
            block_ids,
            WorkerSampling.of(req.sampling, req.seed, first_send and req.wants_prompt_logprobs),
            None if req.lora is None else req.lora.name,
            None if req.lora is None else req.lora.path,
        )

    # ------------------------------------------------------------------ results

    def on_step_result(self, worker_id: str, result: StepResult, now: float) -> list[Event]:
        state = self.placement.workers.get(worker_id)
        if state is None:
            return []  # a result from a worker already declared lost
        step = state.window.close(result.step)
        if result.loras_ready is not None:
            state.loras_ready = {(name, path) for name, path in result.loras_ready}
            for key in state.loras_ready & state.lora_asks.keys():
                del state.lora_asks[key]
        events: list[Event] = self._end_unreadable(state, result.loras_failed)
        done_groups: set[str] = set()
        logprobs = result.logprobs or [None] * len(result.request_ids)
        prompt = {p.request_id: p for p in result.prompt_logprobs}
        more = {s.row: s for s in result.speculation}
        for row, (rid, token, lp) in enumerate(
            zip(result.request_ids, result.token_ids, logprobs, strict=True)
        ):
            req = self.requests.get(rid)
            if req is None or req.status is Status.FINISHED or req.status is Status.WAITING:
                continue  # pipelined tokens past a stop are dropped
            req.pending -= 1
            if prompt and rid in prompt and req.wants_prompt_logprobs:
                # With its first token, in the same result: a request has both or neither.
                req.prompt_logprobs = PromptLogprobs.of(req.prompt_token_ids, prompt[rid])
            tokens, lps = [token], [lp]
            if row in more:
                tokens += more[row].more_token_ids
                lps += more[row].more_logprobs or [None] * len(more[row].more_token_ids)
            # Token by token, as if each came from its own step: a stop ends the completion there,
            # and the tokens after it (accepted proposals past a stop) are dropped.
            reason, taken = None, 0
            while reason is None and taken < len(tokens):
                reason = self.outputs.accept(req, tokens[taken], lps[taken], now)
                taken += 1
            tokens, lps = tokens[:taken], lps[:taken]
            if reason is None:
                event = self.outputs.delta(req, tokens, lps)
            else:
                [event] = self._finish(req, reason, new_tokens=tokens, new_logprobs=lps)
                done_groups.add(req.parent_id or req.request_id)
            events.append(event)
            if prompt and rid in prompt and req.prompt_logprobs is not None:
                event.prompt_logprobs = req.prompt_logprobs
        for pooled in result.pooled:
            req = self.requests.get(pooled.request_id)
            if req is None or req.status is not Status.RUNNING:
                continue  # aborted (or moved) while its step ran
            req.pending -= 1
            req.pooled = pooled.data
            events.extend(self._finish(req, "stop"))
            done_groups.add(req.parent_id or req.request_id)
        if step.decode_rows and "step_s" in result.timings:  # a row's price (speculation.learns)
            rows = step.decode_rows + sum(s.num_proposed for s in result.speculation)
            self.speculation.learned.observe(rows, result.timings["step_s"])
        outcomes = {result.request_ids[s.row]: s for s in result.speculation} if step.lookahead else {}
        for rid in step.request_ids:
            req = self.requests.get(rid)
            if req is None:
                continue
            if rid in step.lookahead:
                # Whatever became of the request, its slots follow the worker's acceptance: a free
                # must name only slots whose KV the worker kept.
                outcome = outcomes.get(rid)
                proposed = outcome.num_proposed if outcome else 0
                accepted = len(outcome.more_token_ids) if outcome else 0
                self.speculation.on_outcome(req, step.lookahead[rid], proposed, accepted)
                req.num_rejected += step.lookahead[rid] - accepted
                self.stats.spec_decodes += 1
                self.stats.spec_proposed += proposed
                self.stats.spec_accepted += accepted
            req.in_flight -= 1
            if req.freeable:
                if req in state.running:
                    state.running.remove(req)
                state.to_free.append(req)
        for rid, slots in zip(step.request_ids, step.slots_after, strict=False):
            done = self.requests.get(rid)
            if done is not None and done.status is not Status.WAITING:
                # This step's KV is written: it survives a restart.
                done.num_committed = slots - done.num_rejected
        for gid in done_groups:
            events.extend(self._done_if_complete(gid))
        return events

    def _finish(
        self,
        req: Request,
        reason: str,
        new_tokens: list[int] | None = None,
        new_logprobs: list[Any] | None = None,
    ) -> list[OutputEvent]:
        state = self.placement.workers.get(req.worker_id)
        was_waiting = req.status is Status.WAITING
        req.status = Status.FINISHED
        req.finish_reason = reason
        if state is not None:
            if was_waiting:
                state.waiting.remove(req)
            elif req in state.running:
                state.running.remove(req)
                if req.in_flight == 0:
                    state.to_free.append(req)
        elif was_waiting:
            self.placement.orphans.remove(req)
        if was_waiting:
            self._release(req)
        return [self.outputs.final(req, reason, new_tokens, new_logprobs)]

    def _end_unreadable(self, state: WorkerState, failures: list[tuple[str, str, str]]) -> list[Event]:
        """The requests on this worker whose adapter it failed to read (its files broke after the load:
        deleted, truncated) end with `lora_unreadable` and the worker's error, which names the file or
        module, and a later request asks for a fresh read. Those waiting were never scheduled; those
        running were sent to a worker that had read nothing beside the steps (nobody else running), and
        its steps left them out, so they free their blocks as unwritten."""
        events: list[Event] = []
        for name, path, error in failures:
            state.lora_asks.pop((name, path), None)
            named = [
                r
                for r in (*state.waiting, *state.running)
                if r.lora is not None and (r.lora.name, r.lora.path) == (name, path)
            ]
            for req in named:
                req.unwritten = req.status is not Status.WAITING
                events.extend(self._finish(req, "error"))
                events.extend(
                    self._done_if_complete(
                        req.parent_id or req.request_id,
                        error_code="lora_unreadable",
                        error_message=f"LoRA adapter {name!r} could not be read: {error}",
                    )
                )
        return events

    def _reject(self, req: Request) -> None:
        """Taken off the waiting queue: it can never fit its worker's pool. Ends in take_rejected."""
        req.status = Status.RUNNING  # so _finish treats it as holding nothing yet
        self._finish(req, "error")
        self._release(req)
        self.rejected.append(req)

    def _release(self, req: Request) -> None:
        self.requests.pop(req.request_id, None)

    def _done_if_complete(
        self, group_id: str, error_code: str | None = None, error_message: str | None = None
    ) -> list[RequestDone]:
        group = self.groups.get(group_id)
        if group is None or any(r.status is not Status.FINISHED for r in group):
            return []
        del self.groups[group_id]
        return [self.outputs.done(group_id, all_completions(group_id, group), error_code, error_message)]
