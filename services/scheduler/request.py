"""A request as the scheduler sees it: what is known, what is computed or in flight, who holds it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pagedserve.shared.lora_modules import LoRAModule
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.prompt_logprobs import PromptLogprobs


class Status(enum.Enum):
    WAITING = "waiting"  # queued on a worker; holds no blocks
    RUNNING = "running"  # holds blocks, scheduled step by step
    PREEMPTED = "preempted"  # leaving: blocks freed once no step in flight names it, then WAITING again
    FINISHED = "finished"  # done; blocks freed once no step in flight names it


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival: float
    worker_id: str
    parent_id: str | None = None  # n > 1: children name the request the client submitted
    index: int = 0  # which completion of the parent this is
    seed: int | None = None  # the seed this completion samples with (children derive their own)
    tenant: str = ""  # whose request: the user (API key name or `user` field), else the client connection
    lora: LoRAModule | None = None  # the LoRA adapter it runs with; None: the base model
    detokenize: bool = True  # False: its client makes the text and matches stop strings (Submit.detokenize)
    output_token_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    # --- KV bookkeeping (mirrors the worker's state one pipeline window ahead)
    on_worker: bool = False  # the worker holds its state (sent as NewRequest, not yet told to forget)
    # Tokens whose KV is computed or being computed, over all steps so far; while speculating steps are
    # in flight, as if every proposal they may bring were accepted (an upper bound), corrected by
    # their results (speculation.py). With nothing in flight it is exact.
    num_slots_used: int = 0
    # Slots the block manager's table holds: the most num_slots_used had been at the last batch that
    # named it. Slots of rejected proposals stay given and are written again by the next tokens; decodes
    # within the blocks held use slots past it without an op (PlanEntry.op_index).
    num_slots_given: int = 0
    lookahead_in_flight: int = 0  # proposal slots of the steps in flight, not yet resolved
    # Of those, the slots of steps whose results came back: KV known written (rejected proposals not
    # counted). Kept as of each step in flight: InFlightStep.slots_after.
    num_committed: int = 0
    num_rejected: int = 0  # proposal slots the worker rejected, over all steps so far (speculation)
    resume: bool = False  # its worker came back with the pool: continue from num_committed (resume op)
    lost_committed: int = 0  # committed KV lost with a worker: prefill computed again when re-admitted
    # Ended because its worker could not read its adapter: its steps left it out, so none of its slots is
    # known written (its free says 0 computed, and no block of it is cached).
    unwritten: bool = False
    num_known_sent: int = 0  # known tokens already told to the block manager (for prefix hashing)
    pending: int = 0  # tokens sampled by steps in flight, not yet seen
    in_flight: int = 0  # steps in flight that name this request
    num_cached_tokens: int = 0  # prefix-cache hit of the last allocation
    shares_last_block: bool = False  # forked: the next write may copy-on-write
    fork_children: int = 0  # n - 1 children still to fork when the prompt completes
    # LongRoPE: admitted with more known tokens than the original length, so the worker rotates all of
    # them with the long factors (set at each admission; services/checkpoint.py rope_switch_at).
    rope_long: bool = False
    prompt_logprobs: PromptLogprobs | None = None  # received (sampling.prompt_logprobs; the parent's)
    pooled: bytes | None = None  # sampling.pooling: the vector the worker sent in place of a token
    refusal: str | None = None  # why it was refused after admission (too large for the pool), in numbers
    # --- speculation (speculation.py): this completion's proposals so far; the averages of its first
    # proposal's acceptance and of each later one's, once the one before it was accepted
    num_proposed: int = 0
    num_accepted: int = 0
    spec_acceptance: float = 0.6
    spec_continuation: float = 0.6
    # --- timing (for metrics)
    first_token_at: float | None = None
    last_token_at: float | None = None
    deadline: float | None = None

    @property
    def num_known(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def known_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def known_since(self, start: int) -> list[int]:
        """Known tokens from index `start` on, without copying the whole prompt (hot path)."""
        np = len(self.prompt_token_ids)
        if start >= np:
            return self.output_token_ids[start - np :]
        return self.prompt_token_ids[start:] + self.output_token_ids

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Asked for and not yet received: its next allocation takes no prefix-cache hits, since the
        worker reads each position's logprob from the hidden state it computes there. Once received
        (a recompute after preemption), it is a plain request again: sent once, never twice."""
        return (
            self.sampling.prompt_logprobs is not None
            and self.parent_id is None
            and self.prompt_logprobs is None
        )

    @property
    def computes_whole_prompt(self) -> bool:
        """Its next allocation takes no prefix-cache hits: the worker reads something from every
        prompt position's hidden state (prompt logprobs, mean or CLS pooling)."""
        pooling = self.sampling.pooling
        return self.wants_prompt_logprobs or (pooling is not None and pooling.whole_prompt)

    @property
    def prefilling(self) -> bool:
        """Still computing tokens that are already known (prompt, or recompute after preemption)."""
        return self.num_slots_used < self.num_known

    @property
    def freeable(self) -> bool:
        return self.status in (Status.FINISHED, Status.PREEMPTED) and self.in_flight == 0

    def reset_to_waiting(self) -> None:
        """It holds nothing any more (preempted, or its worker is gone): recompute from the start.

        Outputs so far stay: a recompute prefills prompt + outputs and the stream goes on."""
        self.status = Status.WAITING
        self.on_worker = False
        self.num_slots_used = self.num_known_sent = self.pending = self.in_flight = self.num_committed = 0
        self.num_slots_given = self.lookahead_in_flight = self.num_rejected = 0
        self.shares_last_block = self.resume = False
