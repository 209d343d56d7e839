"""The scheduler core: who runs in each step, under a token budget, with memory from the block manager.

No sockets and no clock of its own (`now` is passed in). One step for one worker goes:

    plan = scheduler.schedule(worker_id, now)       # decides, and lists the block-manager ops
    reply = <block manager>.apply(plan.block_ops)   # ONE batched RPC (or a direct call in-process)
    execute = scheduler.commit(plan, reply, now)    # -> the Execute message for the worker
    ... later ...
    events = scheduler.on_step_result(worker_id, step_result, now)

Up to `pipeline_depth` steps per worker are in flight: step N+1 is planned before N's tokens are
known (the worker feeds a decode its own last sampled token). Blocks of a finished or preempted
request are freed only once no step in flight names it: the worker may still be writing them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.scheduler.pipeline import PipelineWindow
from pagedserve.services.scheduler.request import Request, Status
from pagedserve.services.scheduler.stopping import CompletionText, Tokenizer, stop_reason
from pagedserve.services.scheduler.waiting import WaitingQueue
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import CachedRequest, Execute, Fork, NewRequest, StepResult

_SEED_MASK = (1 << 63) - 1


@dataclass(slots=True)
class SchedulerLimits:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    aging_s: float = 5.0
    pipeline_depth: int = 2
    max_model_len: int = 2048
    # Blocks kept free when admitting, so running decodes can grow without preempting at once.
    watermark_blocks: int = 1


@dataclass(slots=True)
class OutputEvent:
    """What the client should see: new tokens of one completion, and/or its end."""

    request_id: str  # the id the client submitted
    index: int
    token_ids: list[int]
    text: str
    logprobs: list[Any] | None = None
    finish_reason: str | None = None


@dataclass(slots=True)
class RequestDone:
    """Every completion of a client request has ended."""

    request_id: str
    completions: list[Request]
    texts: list[str]
    logprobs: list[list[Any] | None]
    num_prompt_tokens: int
    num_cached_tokens: int
    error_code: str | None = None


@dataclass(slots=True)
class PlanEntry:
    request: Request
    op_index: int
    num_tokens: int  # new: max new tokens asked for; cached: tokens scheduled
    new: bool
    forks: list[tuple[int, Request]] = field(default_factory=list)  # (op index, child)


@dataclass(slots=True)
class StepPlan:
    worker_id: str
    block_ops: list[list[Any]]
    entries: list[PlanEntry]
    forget: list[str]  # ids the worker drops before this step

    @property
    def empty(self) -> bool:
        return not self.entries


@dataclass(slots=True)
class WorkerState:
    worker_id: str
    num_blocks: int
    block_size: int
    window: PipelineWindow
    waiting: WaitingQueue
    running: list[Request] = field(default_factory=list)
    free_blocks: int = 0
    to_free: list[Request] = field(default_factory=list)  # freeable: no step in flight names them
    forget: list[str] = field(default_factory=list)  # the worker may drop these
    stray: list[str] = field(default_factory=list)  # tables forked for a step that then could not run
    starving: bool = False  # a running request could not grow: admit nobody until it can

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)


@dataclass(slots=True)
class SchedulerStats:
    steps: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    kv_slots_used: int = 0  # summed over steps: token slots holding KV
    kv_slots_held: int = 0  # summed over steps: slots of the blocks those requests hold

    @property
    def kv_utilization(self) -> float:
        return self.kv_slots_used / self.kv_slots_held if self.kv_slots_held else 0.0


class Scheduler:
    def __init__(
        self,
        limits: SchedulerLimits,
        eos_token_ids: Sequence[int],
        tokenizer: Tokenizer | None = None,
        owner: str = "scheduler",
    ) -> None:
        self.limits = limits
        self.eos_token_ids = list(eos_token_ids)
        self.tokenizer = tokenizer
        self.owner = owner
        self.workers: dict[str, WorkerState] = {}
        self.requests: dict[str, Request] = {}  # every completion that is not yet fully released
        self.groups: dict[str, list[Request]] = {}  # client request id -> its completions
        self.texts: dict[str, CompletionText] = {}
        self.logprobs: dict[str, list[Any]] = {}
        self.orphans = WaitingQueue(limits.aging_s)  # waiting while no worker is live
        self.rejected: list[Request] = []  # ended at admission (too big for the pool); see take_rejected
        self.stats = SchedulerStats()
        self._window_base = 0

    # ------------------------------------------------------------------ workers

    def add_worker(self, worker_id: str, num_blocks: int, block_size: int) -> None:
        if worker_id in self.workers:
            self.remove_worker(worker_id)
        # Step numbers never repeat across a worker's comings and goings, so a late result of a
        # dropped incarnation can never be taken for a step of the new one.
        self._window_base += 1 << 32
        self.workers[worker_id] = WorkerState(
            worker_id,
            num_blocks,
            block_size,
            PipelineWindow(self.limits.pipeline_depth, next_step=self._window_base),
            WaitingQueue(self.limits.aging_s),
            free_blocks=num_blocks,
        )
        while len(self.orphans):
            head = self.orphans.peek(0.0)
            assert head is not None
            self.orphans.pop(head)
            self._enqueue(head, front=False)

    def remove_worker(self, worker_id: str) -> list[Request]:
        """The worker is gone, and its pool with it: everything it held is recomputed elsewhere.

        Tokens already streamed stay; a recompute prefills prompt + outputs, so the client's stream
        continues without a gap or a repeat."""
        state = self.workers.pop(worker_id, None)
        if state is None:
            return []
        moved: list[Request] = []
        for req in [r for r in self.requests.values() if r.worker_id == worker_id]:
            if req.status is Status.FINISHED:
                self._release(req)
                continue
            if req.status is Status.WAITING:
                state.waiting.remove(req)
            self._reset_to_waiting(req)
            moved.append(req)
        # They arrived before anyone still waiting: back in front, oldest first.
        for req in sorted(moved, key=lambda r: r.arrival, reverse=True):
            self._enqueue(req, front=True)
        return moved

    def _least_loaded(self) -> WorkerState | None:
        return min(self.workers.values(), key=lambda w: w.load, default=None)

    def _enqueue(self, req: Request, front: bool) -> None:
        target = self._least_loaded()
        if target is None:
            req.worker_id = ""
            self.orphans.push(req)
            return
        req.worker_id = target.worker_id
        (target.waiting.push_front if front else target.waiting.push)(req)

    # ------------------------------------------------------------------ requests

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        now: float,
        deadline: float | None = None,
    ) -> None:
        """Queue a validated request on the least-loaded worker (or until one registers)."""
        if request_id in self.groups:
            raise ValueError(f"request_id {request_id!r} is already live")
        req = Request(
            request_id,
            list(prompt_token_ids),
            sampling,
            now,
            "",
            seed=sampling.seed,
            deadline=deadline,
            fork_children=sampling.n - 1,
        )
        self.requests[request_id] = req
        self.groups[request_id] = [req]
        self.texts[request_id] = CompletionText(
            self.tokenizer, list(sampling.stop), sampling.include_stop_str_in_output
        )
        self.stats.prompt_tokens += len(prompt_token_ids)
        self._enqueue(req, front=False)

    def abort(self, request_id: str, reason: str = "abort") -> list[OutputEvent | RequestDone]:
        group = self.groups.get(request_id)
        if group is None:
            return []
        events: list[OutputEvent | RequestDone] = []
        for req in group:
            if req.status is not Status.FINISHED:
                events.extend(self._finish(req, reason))
        return events + self._done_if_complete(request_id)

    def expire(self, now: float) -> list[OutputEvent | RequestDone]:
        """End requests past their deadline: `no_workers` when nobody could serve them."""
        events: list[OutputEvent | RequestDone] = []
        for rid, group in list(self.groups.items()):
            head = group[0]
            if head.deadline is not None and now >= head.deadline:
                code = "no_workers" if not self.workers else "timeout"
                for req in group:
                    if req.status is not Status.FINISHED:
                        events.extend(self._finish(req, "error"))
                events.extend(self._done_if_complete(rid, error_code=code))
        return events

    def take_rejected(self) -> list[OutputEvent | RequestDone]:
        """Requests that can never fit their worker's pool end with `too_large_for_pool`."""
        events: list[OutputEvent | RequestDone] = []
        for req in self.rejected:
            events.extend(
                self._done_if_complete(req.parent_id or req.request_id, error_code="too_large_for_pool")
            )
        self.rejected.clear()
        return events

    @property
    def num_waiting(self) -> int:
        return len(self.orphans) + sum(len(w.waiting) for w in self.workers.values())

    @property
    def num_running(self) -> int:
        return sum(len(w.running) for w in self.workers.values())

    def has_unfinished(self) -> bool:
        return bool(self.groups)

    def live_request_ids(self, worker_id: str | None = None) -> list[str]:
        """Ids whose blocks the block manager holds (for lease renewal)."""
        return [
            r.request_id
            for r in self.requests.values()
            if r.num_scheduled > 0 and (worker_id is None or r.worker_id == worker_id)
        ]

    # ------------------------------------------------------------------ planning

    def can_schedule(self, worker_id: str) -> bool:
        state = self.workers.get(worker_id)
        if state is None or not state.window.has_room():
            return False
        if state.to_free or len(state.waiting):
            return True
        return any(self._schedulable(r) for r in state.running)

    @staticmethod
    def _schedulable(req: Request) -> bool:
        if req.status is not Status.RUNNING:
            return False
        num_output = len(req.output_token_ids)
        known = len(req.prompt_token_ids) + num_output
        if req.num_scheduled < known:
            return True  # prefilling
        return num_output + req.pending < req.sampling.max_tokens and req.num_scheduled < known + req.pending

    def _blocks_to_grow(self, req: Request, num_tokens: int, block_size: int) -> int:
        have = -(-req.num_scheduled // block_size)
        need = -(-(req.num_scheduled + num_tokens) // block_size) - have
        return need + (1 if req.shares_last_block and req.num_scheduled % block_size else 0)

    def schedule(self, worker_id: str, now: float) -> StepPlan:
        state = self.workers[worker_id]
        bs = state.block_size
        ops: list[list[Any]] = []
        entries: list[PlanEntry] = []
        for req in state.to_free:
            ops.append(["free", req.request_id])
            self._after_free(req, state)
        state.to_free.clear()
        ops.extend(["free", rid] for rid in state.stray)
        state.stray.clear()

        budget = self.limits.max_num_batched_tokens
        free = state.free_blocks
        state.starving = False
        # Decodes first (one token each), then prompts already being prefilled in chunks.
        decodes: list[Request] = []
        prefills: list[Request] = []
        for req in state.running:
            if self._schedulable(req):
                (prefills if req.num_scheduled < req.num_known else decodes).append(req)
        for want_prefill, queue in ((False, decodes), (True, prefills)):
            for req in queue:
                if budget <= 0:
                    break
                if req.status is not Status.RUNNING:
                    continue  # preempted a moment ago, for someone earlier in this loop
                n = min(budget, req.num_known - req.num_scheduled) if want_prefill else 1
                need = self._blocks_to_grow(req, n, bs)
                if need > free and want_prefill:
                    # A prompt chunk shrinks to the memory there is before anyone is preempted.
                    n = min(n, free * bs + (-req.num_scheduled) % bs)
                    need = self._blocks_to_grow(req, n, bs) if n > 0 else need
                if need > free or n <= 0:
                    state.starving = True
                    self._preempt_for(req, state, entries, ops)
                    continue
                new_known = req.known_since(req.num_known_sent) if req.num_known_sent < req.num_known else []
                entry = PlanEntry(req, len(ops), n, new=False)
                ops.append(["grow", req.request_id, n, new_known])
                if want_prefill and req.num_scheduled + n == req.num_known:
                    self._plan_forks(req, entry, ops)
                entries.append(entry)
                free -= need
                budget -= n

        # Admission: policy order, head-of-line (a big request is not overtaken forever by small ones).
        while (
            not state.starving
            and budget > 0
            and len(state.waiting)
            and len(state.running) + self._admitted(entries) < self.limits.max_num_seqs
        ):
            req = state.waiting.peek(now)
            assert req is not None
            tokens = req.known_token_ids()
            if -(-(len(tokens) + 1) // bs) > state.num_blocks:
                # Could never fit, even alone: waiting would wedge the queue behind it.
                state.waiting.pop(req)
                req.status = Status.RUNNING  # so _finish treats it as holding nothing yet
                self._finish(req, "error")
                self._release(req)
                self.rejected.append(req)
                continue
            max_new = min(budget, len(tokens))
            need = -(-max_new // bs)
            if need + self.limits.watermark_blocks > free and not (need <= free and not state.running):
                break
            state.waiting.pop(req)
            entry = PlanEntry(req, len(ops), max_new, new=True)
            ops.append(["alloc", state.worker_id, req.request_id, self.owner, tokens, max_new])
            if max_new == len(tokens):
                self._plan_forks(req, entry, ops)
            entries.append(entry)
            free -= need
            budget -= max_new
        forget, state.forget = state.forget, []
        return StepPlan(worker_id, ops, entries, forget)

    @staticmethod
    def _admitted(entries: list[PlanEntry]) -> int:
        return sum(1 for e in entries if e.new)

    def _plan_forks(self, req: Request, entry: PlanEntry, ops: list[list[Any]]) -> None:
        """n > 1: the children share the prompt's blocks from the step that completes it."""
        for i in range(1, req.fork_children + 1):
            child_id = f"{req.request_id}#{i}"
            seed = None if req.seed is None else (req.seed + i * 0x9E3779B97F4A7C15) & _SEED_MASK
            child = Request(
                child_id,
                req.prompt_token_ids,
                req.sampling,
                req.arrival,
                req.worker_id,
                parent_id=req.request_id,
                index=i,
                seed=seed,
                deadline=req.deadline,
            )
            entry.forks.append((len(ops), child))
            ops.append(["fork", req.request_id, child_id, self.owner])

    def _preempt_for(
        self, needy: Request, state: WorkerState, entries: list[PlanEntry], ops: list[list[Any]]
    ) -> None:
        """Free memory for `needy` by preempting the lowest-priority, newest running request.

        While a victim's steps are in flight its blocks stay taken, so the needy request waits a
        step or two rather than several victims falling at once."""
        if any(r.status is Status.PREEMPTED for r in state.running):
            return  # memory is already on its way back
        scheduled = {id(e.request) for e in entries}
        candidates = [r for r in state.running if r.status is Status.RUNNING and id(r) not in scheduled]
        if not candidates:
            return
        victim = min(candidates, key=lambda r: (r.sampling.priority, -r.arrival))
        victim.status = Status.PREEMPTED
        self.stats.preemptions += 1
        if victim.in_flight == 0:
            state.running.remove(victim)
            ops.append(["free", victim.request_id])
            self._after_free(victim, state)

    def _after_free(self, req: Request, state: WorkerState) -> None:
        """A free op for `req` is in this batch: the worker forgets it; a preempted one queues again."""
        if req.on_worker:
            state.forget.append(req.request_id)
        if req.status is Status.PREEMPTED:
            self._reset_to_waiting(req)
            state.waiting.push_front(req)
        else:
            self._release(req)

    def _reset_to_waiting(self, req: Request) -> None:
        req.status = Status.WAITING
        req.on_worker = False
        req.num_scheduled = req.num_known_sent = req.pending = req.in_flight = 0
        req.shares_last_block = False

    def _release(self, req: Request) -> None:
        self.requests.pop(req.request_id, None)

    # ------------------------------------------------------------------ commit

    def commit(self, plan: StepPlan, reply: dict[str, Any], now: float) -> Execute | None:
        """Apply the block manager's answers; build the Execute (None if nothing could run)."""
        state = self.workers.get(plan.worker_id)
        if state is None:
            return None
        results = reply["results"]
        state.free_blocks = reply["free_blocks"].get(plan.worker_id, state.free_blocks)
        execute = Execute(step=-1, finished_ids=plan.forget)
        sampled_ids: list[str] = []
        for entry in plan.entries:
            req = entry.request
            res = results[entry.op_index]
            if res is None or isinstance(res, dict):
                if entry.new:  # no room after all (prefix hits pulled cached blocks): wait in front
                    state.waiting.push_front(req)
                else:
                    state.starving = True
                # A fork of a parent that cannot run this step holds blocks nobody will use.
                state.stray.extend(c.request_id for i, c in entry.forks if results[i] is True)
                continue
            if req.status is not Status.RUNNING and not entry.new:
                continue  # aborted between plan and commit
            if entry.new:
                block_ids, num_cached, num_new = res
                req.status = Status.RUNNING
                req.on_worker = True
                req.num_scheduled = num_cached + num_new
                req.num_known_sent = req.num_known
                req.num_cached_tokens = num_cached
                self.stats.cached_tokens += num_cached
                state.running.append(req)
                execute.new_requests.append(
                    NewRequest(
                        req.request_id,
                        req.known_token_ids(),
                        len(req.prompt_token_ids),
                        num_cached,
                        num_new,
                        block_ids,
                        self._worker_sampling(req),
                    )
                )
            else:
                new_block_ids, replaced, copies = res
                req.num_scheduled += entry.num_tokens
                req.num_known_sent = req.num_known
                req.shares_last_block = False
                execute.copies.extend((int(s), int(d)) for s, d in copies)
                execute.cached_requests.append(
                    CachedRequest(
                        req.request_id,
                        entry.num_tokens,
                        new_block_ids,
                        [(int(i), int(b)) for i, b in replaced],
                    )
                )
            req.in_flight += 1
            if req.num_scheduled >= req.num_known:
                req.pending += 1
                sampled_ids.append(req.request_id)
            for op_index, child in entry.forks:
                if results[op_index] is not True:
                    continue
                self._adopt_child(req, child, state)
                execute.forks.append(Fork(req.request_id, child.request_id, child.seed))
                sampled_ids.append(child.request_id)
            if entry.forks:
                req.fork_children = 0
        if not execute.new_requests and not execute.cached_requests:
            state.forget = plan.forget + state.forget
            return None
        step_ids = execute.request_ids() + [f.child_id for f in execute.forks]
        execute.step = state.window.open(step_ids, now, execute.num_scheduled_tokens)
        self._account_kv(state)
        self.stats.steps += 1
        return execute

    def _adopt_child(self, parent: Request, child: Request, state: WorkerState) -> None:
        child.status = Status.RUNNING
        child.on_worker = True
        child.num_scheduled = parent.num_scheduled
        child.num_known_sent = parent.num_known_sent
        child.pending = 1
        child.in_flight = 1
        child.shares_last_block = parent.shares_last_block = True
        self.requests[child.request_id] = child
        self.groups[parent.request_id].append(child)
        self.texts[child.request_id] = CompletionText(
            self.tokenizer, list(child.sampling.stop), child.sampling.include_stop_str_in_output
        )
        state.running.append(child)

    def _worker_sampling(self, req: Request) -> dict[str, Any]:
        params = req.sampling.model_dump(exclude={"stop", "n", "priority", "include_stop_str_in_output"})
        params["seed"] = req.seed
        return params

    def _account_kv(self, state: WorkerState) -> None:
        bs = state.block_size
        used = sum(r.num_scheduled for r in state.running)
        held = sum(-(-r.num_scheduled // bs) for r in state.running) * bs
        self.stats.kv_slots_used += used
        self.stats.kv_slots_held += held

    # ------------------------------------------------------------------ results

    def on_step_result(
        self, worker_id: str, result: StepResult, now: float
    ) -> list[OutputEvent | RequestDone]:
        state = self.workers.get(worker_id)
        if state is None:
            return []  # a result from a worker already declared lost
        step = state.window.close(result.step)
        events: list[OutputEvent | RequestDone] = []
        done_groups: set[str] = set()
        logprobs = result.logprobs or [None] * len(result.request_ids)
        for rid, token, lp in zip(result.request_ids, result.token_ids, logprobs, strict=True):
            req = self.requests.get(rid)
            if req is None or req.status is Status.FINISHED or req.status is Status.WAITING:
                continue  # pipelined tokens past a stop are dropped
            req.pending -= 1
            events.extend(self._accept_token(req, token, lp, now))
            if req.status is Status.FINISHED:
                done_groups.add(req.parent_id or req.request_id)
        for rid in step.request_ids:
            req = self.requests.get(rid)
            if req is None:
                continue
            req.in_flight -= 1
            if req.freeable:
                if req in state.running:
                    state.running.remove(req)
                state.to_free.append(req)
        for gid in done_groups:
            events.extend(self._done_if_complete(gid))
        return events

    def _accept_token(self, req: Request, token: int, logprob: Any, now: float) -> list[OutputEvent]:
        req.output_token_ids.append(token)
        self.stats.generated_tokens += 1
        if req.first_token_at is None:
            req.first_token_at = now
        req.last_token_at = now
        if logprob is not None:
            self.logprobs.setdefault(req.request_id, []).append(logprob)
        reason = stop_reason(
            req.sampling,
            token,
            len(req.output_token_ids),
            req.num_known,
            self.eos_token_ids,
            self.limits.max_model_len,
        )
        text = self.texts[req.request_id]
        if text.add(req.output_token_ids) and reason is None:
            reason = "stop"
        if reason is not None:
            return self._finish(req, reason, new_tokens=[token], new_logprobs=[logprob])
        delta = text.take_delta(False, req.output_token_ids)
        return [
            OutputEvent(
                req.parent_id or req.request_id,
                req.index,
                [token],
                delta,
                None if logprob is None else [logprob],
            )
        ]

    def _finish(
        self,
        req: Request,
        reason: str,
        new_tokens: list[int] | None = None,
        new_logprobs: list[Any] | None = None,
    ) -> list[OutputEvent]:
        state = self.workers.get(req.worker_id)
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
            self.orphans.remove(req)
        if was_waiting:
            self._release(req)
        delta = self.texts[req.request_id].take_delta(True, req.output_token_ids)
        lps = None if new_logprobs is None or new_logprobs == [None] else new_logprobs
        return [OutputEvent(req.parent_id or req.request_id, req.index, new_tokens or [], delta, lps, reason)]

    def _done_if_complete(self, group_id: str, error_code: str | None = None) -> list[RequestDone]:
        group = self.groups.get(group_id)
        if group is None:
            return []
        parent = group[0]
        # Children not forked yet (the prompt never completed) end with their parent.
        if any(r.status is not Status.FINISHED for r in group):
            return []
        del self.groups[group_id]
        completions = sorted(group, key=lambda r: r.index)
        for i in range(len(group), parent.sampling.n):
            ghost = Request(
                f"{group_id}#{i}",
                parent.prompt_token_ids,
                parent.sampling,
                parent.arrival,
                parent.worker_id,
                parent_id=group_id,
                index=i,
                status=Status.FINISHED,
                finish_reason=parent.finish_reason,
            )
            completions.append(ghost)
        texts = [self.texts.pop(r.request_id).text if r.request_id in self.texts else "" for r in completions]
        logprobs = [self.logprobs.pop(r.request_id, None) for r in completions]
        return [
            RequestDone(
                group_id,
                completions,
                texts,
                logprobs,
                len(parent.prompt_token_ids),
                parent.num_cached_tokens,
                error_code,
            )
        ]
