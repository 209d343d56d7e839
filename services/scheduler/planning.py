"""Planning one step for one worker: running requests first, then admission, under two budgets.

The token budget is `max_num_batched_tokens`; the block budget is the mirror of the pool's free
blocks. Decodes go first (one token each), then prompts already being prefilled in chunks, then
waiting requests in policy order. A running request that cannot grow preempts the lowest-priority,
newest running one, and nobody is admitted in that step. The plan lists the block-manager ops of
the step (ONE batched RPC); nothing is final until `Scheduler.commit` reads the reply.

LongRoPE models (`limits.rope_switch_at`): transformers rotates every position with the short factors
while a sequence fits the original length, and once it passes it recomputes the whole sequence with
the long ones. A request admitted within the length (`rope_long` false) is therefore recomputed, like
a preempted one, instead of decoding the first position past it; admitted past it, every token is long
from the start, and its prefix-cache entries live under their own salt (the same tokens are other KV).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pagedserve.services.scheduler.forks import plan_forks
from pagedserve.services.scheduler.limits import SchedulerLimits, SchedulerStats
from pagedserve.services.scheduler.placement import WorkerState
from pagedserve.services.scheduler.request import Request, Status
from pagedserve.services.scheduler.speculation import SpeculationPolicy
from pagedserve.shared.paging import blocks_for
from pagedserve.shared.protocol.blocks import Alloc, BlockOp, Fork, Free, Grow, Resume

# How long a request waits for its worker to read its LoRA adapter on the side before the read happens
# inside a step after all (a read takes 0.02 s for rank 16 on the bundled model: docs/lora.md).
LORA_READ_PATIENCE_S = 2.0
LONG_ROPE_SALT = "longrope-long"  # the prefix-cache namespace of requests rotated with the long factors


@dataclass(slots=True)
class PlanEntry:
    request: Request
    # Its op in the batch; None: a decode within the blocks its request holds, in a batch of nothing
    # else. Its grow would change no block, so it is not sent, and a step of such decodes alone (15 of
    # 16 at one request) needs no block manager. The next grow or free tells the slots and tokens since.
    op_index: int | None
    num_tokens: int  # new: max new tokens asked for; cached: tokens scheduled
    new: bool
    lookahead: int = 0  # a decode's slots for proposed tokens (speculation.py)
    forks: list[tuple[int, Request]] = field(default_factory=list)  # (op index, child)
    resume: bool = False  # a parked request continuing on its restarted worker (resumption.py)


@dataclass(slots=True)
class StepPlan:
    worker_id: str
    block_ops: list[BlockOp]
    entries: list[PlanEntry]
    forget: list[str]  # ids the worker drops before this step
    # LoRA adapters (name, path) waiting requests need and the worker has not read: it reads them on
    # the side (Execute.prefetch_loras) while these requests wait.
    prefetch: list[tuple[str, str]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.entries

    @property
    def idle(self) -> bool:
        """Nothing to run or free."""
        return not self.entries and not self.block_ops

    @property
    def only_frees(self) -> bool:
        """Nothing to run, memory to give back: planning again may find room."""
        return not self.entries and all(type(op) is Free for op in self.block_ops)

    def new_table_ids(self) -> list[str]:
        """The tables this batch creates where the block manager has room (allocs, forked children):
        a plan abandoned before its answer (its worker lost) must free them."""
        ids: list[str] = []
        for op in self.block_ops:
            if isinstance(op, Alloc):
                ids.append(op.request_id)
            elif isinstance(op, Fork):
                ids.append(op.child_id)
        return ids


def schedulable(req: Request) -> bool:
    """Running, and another step would compute something: a prompt chunk, or a token still wanted."""
    if req.status is not Status.RUNNING:
        return False
    num_output = len(req.output_token_ids)
    known = len(req.prompt_token_ids) + num_output
    if req.num_slots_used < known:
        return True  # prefilling
    if req.sampling.pooling is not None:
        return False  # prefill only: it ends with the step that computes its prompt's end
    # Tokens known once the steps in flight answer: at least one each, at most one more per proposal
    # slot. num_slots_used counts every proposal slot as if accepted, so both sides are upper bounds.
    return (
        num_output + req.pending < req.sampling.max_tokens
        and req.num_slots_used < known + req.pending + req.lookahead_in_flight
    )


def free_ops(req: Request) -> list[BlockOp]:
    """Free a table whose slots are all computed (no step in flight names it). Slots and tokens it
    computed that the block manager was never told (decodes within its blocks, accepted proposals of
    its last step) go first, so the blocks they fill are cached like any other; the free then confirms
    exactly the computed slots."""
    if req.unwritten:
        return [Free(req.request_id, 0)]
    ops: list[BlockOp] = []
    untold = max(0, req.num_slots_used - req.num_slots_given)
    if untold or req.num_known_sent < min(req.num_slots_used, req.num_known):
        ops.append(Grow(req.request_id, untold, req.known_since(req.num_known_sent)))
    ops.append(Free(req.request_id, req.num_slots_used))
    return ops


def decoding(req: Request) -> bool:
    """Its prompt is scheduled and at most one known token is not: the next step computes that token
    (or, pipelined, the token the step in flight samples) and samples after it."""
    return req.num_slots_used + 1 >= req.num_known and req.num_slots_used >= len(req.prompt_token_ids)


def cache_namespace(req: Request) -> str | None:
    """The prefix-cache namespace of `req`'s blocks: KV computed under other weights (its LoRA
    adapter) or other rotations (LongRoPE's long factors) never serves or takes another's hits."""
    parts = [] if req.lora is None else [req.lora.namespace]
    if req.rope_long:
        parts.append(LONG_ROPE_SALT)
    return "|".join(parts) or None


def blocks_to_grow(req: Request, num_tokens: int, block_size: int) -> int:
    # Slots given before to proposals that were rejected are written again first: no block for them.
    given = req.num_slots_given
    need = blocks_for(max(given, req.num_slots_used + num_tokens), block_size) - blocks_for(given, block_size)
    # A forked request's partly filled last block is shared: its first write copies it.
    return need + (1 if req.shares_last_block and req.num_slots_used % block_size else 0)


@dataclass(slots=True)
class _Draft:
    """One step being planned: its ops and entries, and what is left of both budgets."""

    state: WorkerState
    owner: str
    tokens: int  # token budget left
    blocks: int  # free blocks left (as far as the mirror knows)
    ops: list[BlockOp] = field(default_factory=list)
    entries: list[PlanEntry] = field(default_factory=list)
    prefetch: list[tuple[str, str]] = field(default_factory=list)
    within_blocks: list[tuple[PlanEntry, Grow]] = field(default_factory=list)  # decodes whose grow waits


class Planner:
    def __init__(
        self,
        limits: SchedulerLimits,
        stats: SchedulerStats,
        release: Callable[[Request], None],
        reject: Callable[[Request], None],
        speculation: SpeculationPolicy,
    ) -> None:
        self.limits = limits
        self.stats = stats
        self.speculation = speculation
        self._release = release  # a finished request's free op is out: the core forgets it
        self._reject = reject  # a request that can never fit its worker's pool

    def plan(self, state: WorkerState, owner: str, now: float) -> StepPlan:
        draft = _Draft(state, owner, self.limits.max_num_batched_tokens, state.free_blocks)
        for req in state.to_free:
            # No step names it any more: its scheduled slots are exactly the computed ones.
            draft.ops.extend(free_ops(req))
            self._after_free(req, state)
        state.to_free.clear()
        # Forked for a step that never ran: none of it is known to be written.
        draft.ops.extend(Free(rid, 0) for rid in state.stray)
        state.stray.clear()
        state.starving = False
        self._plan_running(draft)
        self._plan_admission(draft, now)
        if draft.ops:
            # The batch goes anyway: decodes within their blocks are told too, so that a table the block
            # manager dropped (it lost the pool) is found in any batch that could hand its blocks out.
            for entry, grow in draft.within_blocks:
                entry.op_index = len(draft.ops)
                draft.ops.append(grow)
        forget, state.forget = state.forget, []
        return StepPlan(state.worker_id, draft.ops, draft.entries, forget, draft.prefetch)

    def _plan_running(self, draft: _Draft) -> None:
        state, bs = draft.state, draft.state.block_size
        decodes: list[Request] = []
        prefills: list[Request] = []
        for req in state.running:
            if schedulable(req):
                (decodes if decoding(req) else prefills).append(req)
        lookahead = self.speculation.grant(decodes) if self.speculation.enabled else {}
        for want_prefill, queue in ((False, decodes), (True, prefills)):
            for req in queue:
                if draft.tokens <= 0:
                    break
                if req.status is not Status.RUNNING:
                    continue  # preempted a moment ago, for someone earlier in this loop
                if not want_prefill and self._crosses_rope_switch(req):
                    self._leave(req, draft)  # back with its outputs, past the switch: all long
                    self.stats.rope_recomputes += 1
                    continue
                n = min(draft.tokens, req.num_known - req.num_slots_used) if want_prefill else 1
                # Proposals count as tokens; a resumed request is sent as new, without any.
                ahead = 0 if req.resume else min(lookahead.get(id(req), 0), draft.tokens - n)
                ahead = min(ahead, self._room_before_rope_switch(req, n))
                need = blocks_to_grow(req, n + ahead, bs)
                if ahead and need > draft.blocks - self.limits.watermark_blocks - len(decodes):
                    # Lookahead takes no block a decode of this step, or the watermark, may need.
                    ahead = 0
                    need = blocks_to_grow(req, n, bs)
                if need > draft.blocks and want_prefill:
                    # A prompt chunk shrinks to the memory there is before anyone is preempted.
                    n = min(n, draft.blocks * bs + (-req.num_slots_used) % bs)
                    need = blocks_to_grow(req, n, bs) if n > 0 else need
                if need > draft.blocks or n <= 0:
                    state.starving = True
                    self._preempt_for(draft)
                    continue
                new_known = req.known_since(req.num_known_sent) if req.num_known_sent < req.num_known else []
                entry = PlanEntry(req, len(draft.ops), n, new=False, lookahead=ahead, resume=req.resume)
                if req.resume:  # back to its committed slots, the whole table answered for the worker
                    draft.ops.append(Resume(req.request_id, req.num_slots_used, n, new_known))
                else:
                    # The table grows only past the slots it was given (rejected proposals' slots are reused;
                    # those of decodes within its blocks that were not sent are told now).
                    grow = Grow(
                        req.request_id,
                        max(0, req.num_slots_used + n + ahead - req.num_slots_given),
                        new_known,
                    )
                    if need == 0 and not want_prefill:
                        entry.op_index = None
                        draft.within_blocks.append((entry, grow))
                    else:
                        draft.ops.append(grow)
                if want_prefill and req.num_slots_used + n == req.num_known:
                    entry.forks = plan_forks(req, draft.owner, draft.ops)
                draft.entries.append(entry)
                draft.blocks -= need
                draft.tokens -= n + ahead

    def _plan_admission(self, draft: _Draft, now: float) -> None:
        """Policy order, head-of-line: a big request is not overtaken forever by small ones."""
        state, bs = draft.state, draft.state.block_size
        while (
            not state.starving
            and draft.tokens > 0
            and len(state.waiting)
            and len(state.running) + sum(1 for e in draft.entries if e.new) < self.limits.max_num_seqs
        ):
            req = state.waiting.peek(now)
            assert req is not None
            tokens = req.known_token_ids()
            if blocks_for(len(tokens) + 1, bs) > state.num_blocks:
                # Could never fit, even alone: waiting would wedge the queue behind it.
                state.waiting.pop(req)
                req.refusal = (
                    f"the request needs KV for {len(tokens) + 1:,} tokens ({len(tokens):,} known + 1 to generate: "
                    f"{blocks_for(len(tokens) + 1, bs):,} blocks of {bs}) and worker {state.worker_id!r}'s whole "
                    f"pool holds {state.num_blocks * bs:,} tokens ({state.num_blocks:,} blocks); shorten the "
                    "prompt, or give the workers a larger pool (--kv-cache-memory, --num-blocks)"
                )
                self._reject(req)
                continue
            if req.lora is not None and not self._adapter_fits(req, draft):
                break  # head of line: it runs once a running adapter's requests have finished
            if req.lora is not None and self._adapter_unread(req, draft, now):
                break  # head of line: it runs once its worker has read the adapter on the side
            max_new = min(draft.tokens, len(tokens))
            need = blocks_for(max_new, bs)
            if need + self.limits.watermark_blocks > draft.blocks and not (
                need <= draft.blocks and not state.running
            ):
                break
            state.waiting.pop(req)
            switch = self.limits.rope_switch_at
            req.rope_long = switch is not None and len(tokens) > switch
            entry = PlanEntry(req, len(draft.ops), max_new, new=True)
            draft.ops.append(
                Alloc(
                    state.worker_id,
                    req.request_id,
                    draft.owner,
                    tokens,
                    max_new,
                    use_prefix_cache=not req.computes_whole_prompt,
                    cache_namespace=cache_namespace(req),
                )
            )
            if max_new == len(tokens):
                entry.forks = plan_forks(req, draft.owner, draft.ops)
            draft.entries.append(entry)
            draft.blocks -= need
            draft.tokens -= max_new

    def _adapter_fits(self, req: Request, draft: _Draft) -> bool:
        """Admitting `req` keeps the worker's running requests within max_loras distinct adapters, so
        every step of every running request fits the worker's adapter slots."""
        assert req.lora is not None
        running = {r.lora.name for r in draft.state.running if r.lora is not None}
        running.update(e.request.lora.name for e in draft.entries if e.new and e.request.lora is not None)
        return req.lora.name in running or len(running) < self.limits.max_loras

    def _adapter_unread(self, req: Request, draft: _Draft, now: float) -> bool:
        """Whether `req` waits while its worker reads its adapter off the step path (asked for in this
        step): only where the worker says what it has read (StepResult.loras_ready) and runs requests
        that a read inside a step would stall; for LORA_READ_PATIENCE_S at most (a worker that never
        answers the ask reads it inside the step, as one with nobody to stall does)."""
        assert req.lora is not None
        state, key = draft.state, (req.lora.name, req.lora.path)
        if state.loras_ready is None or key in state.loras_ready or not state.running:
            return False
        if now - state.lora_asks.setdefault(key, now) > LORA_READ_PATIENCE_S:
            return False
        if key not in draft.prefetch:
            draft.prefetch.append(key)
        return True

    def _preempt_for(self, draft: _Draft) -> None:
        """Free memory by preempting the lowest-priority, newest running request.

        While a victim's steps are in flight its blocks stay taken, so the needy request waits a
        step or two rather than several victims falling at once."""
        state = draft.state
        if any(r.status is Status.PREEMPTED for r in state.running):
            return  # memory is already on its way back
        scheduled = {id(e.request) for e in draft.entries}
        candidates = [r for r in state.running if r.status is Status.RUNNING and id(r) not in scheduled]
        if not candidates:
            return
        victim = min(candidates, key=lambda r: (r.sampling.priority, -r.arrival))
        self._leave(victim, draft)
        self.stats.preemptions += 1

    def _leave(self, req: Request, draft: _Draft) -> None:
        """Preempt `req`: its blocks go back (now, or once no step in flight names it) and it waits
        in front to be recomputed from prompt + outputs."""
        req.status = Status.PREEMPTED
        if req.in_flight == 0:
            draft.state.running.remove(req)
            draft.ops.extend(free_ops(req))
            self._after_free(req, draft.state)

    def _room_before_rope_switch(self, req: Request, n: int) -> int:
        """How many proposal slots fit after this step's `n` before a LongRoPE request still rotated
        short reaches the original length (its crossing is a recompute, never a proposal)."""
        switch = self.limits.rope_switch_at
        if switch is None or req.rope_long:
            return 1 << 30
        return max(0, switch - req.num_slots_used - n)

    def _crosses_rope_switch(self, req: Request) -> bool:
        """Would its next decode compute a position past LongRoPE's original length on top of KV
        rotated with the short factors?"""
        switch = self.limits.rope_switch_at
        return switch is not None and not req.rope_long and req.num_slots_used >= switch

    def _after_free(self, req: Request, state: WorkerState) -> None:
        """A free op for `req` is in this batch: the worker forgets it; a preempted one queues again."""
        if req.on_worker:
            state.forget.append(req.request_id)
        if req.status is Status.PREEMPTED:
            req.reset_to_waiting()
            state.waiting.push_front(req)
        else:
            self._release(req)
