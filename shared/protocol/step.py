"""Scheduler <-> worker hot path: `Execute` carries deltas, `StepResult` carries sampled tokens.

Plain slotted dataclasses; on the wire each is a flat list (no field names, no validation beyond
the frame's version): these are built and parsed once per step for hundreds of requests.

Worker semantics of one Execute (the order matters):
1. forget `finished_ids` (finished, aborted or preempted; their blocks are the scheduler's again);
2. add `new_requests` in full, extend `cached_requests` by their new / replaced block ids;
3. perform the copy-on-write `copies` (src block -> dst block, every layer, K and V);
4. run one forward over all scheduled tokens, packed: for each request the input tokens are
   token_ids[num_computed : num_computed + num_scheduled] (a decode's input is the worker's own
   last sampled token, so the scheduler can build step N+1 before N's result);
5. sample one token for each request whose computed tokens now reach the end of its known tokens
   (a prefill chunk that stops short of the prompt's end samples nothing);
6. `forks` (n > 1): each child copies its parent's state, then samples its own first token from the
   parent's last logits with its own seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from pagedserve.shared.protocol.constraints import StructuredOutputs
from pagedserve.shared.protocol.frontend import SamplingParams


@dataclass(slots=True, frozen=True)
class WorkerSampling:
    """What the worker reads of a request's SamplingParams: the draw, the penalties, the masks.

    No defaults here: every value comes from a SamplingParams (`of`), whose defaults are the only
    ones. Stop strings, n, priority and max_tokens stay with the scheduler, which stops requests."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None  # the request's own (a child of n > 1 has its parent's plus its index)
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    min_tokens: int
    stop_token_ids: list[int]
    logprobs: int | None
    logit_bias: dict[int, float] | None
    structured_outputs: StructuredOutputs | None

    @classmethod
    def of(cls, params: SamplingParams, seed: int | None) -> WorkerSampling:
        return cls(
            params.temperature,
            params.top_k,
            params.top_p,
            params.min_p,
            seed,
            params.repetition_penalty,
            params.presence_penalty,
            params.frequency_penalty,
            params.min_tokens,
            list(params.stop_token_ids),
            params.logprobs,
            params.logit_bias,
            params.structured_outputs,
        )

    @property
    def has_penalty(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def with_seed(self, seed: int | None) -> WorkerSampling:
        return replace(self, seed=seed)

    def to_wire(self) -> list[Any]:
        so = self.structured_outputs
        return [
            self.temperature,
            self.top_k,
            self.top_p,
            self.min_p,
            self.seed,
            self.repetition_penalty,
            self.presence_penalty,
            self.frequency_penalty,
            self.min_tokens,
            self.stop_token_ids,
            self.logprobs,
            self.logit_bias,
            None if so is None else so.model_dump(),
        ]

    @classmethod
    def from_wire(cls, w: list[Any]) -> WorkerSampling:
        so = w[12]
        return cls(*w[:12], None if so is None else StructuredOutputs.model_validate(so))


@dataclass(slots=True)
class NewRequest:
    """A request the worker has not seen (or must recompute after preemption / a lost worker)."""

    request_id: str
    token_ids: list[int]  # every known token: prompt, then outputs so far (recompute)
    num_prompt_tokens: int  # token_ids[:num_prompt_tokens] is the prompt (penalties need it)
    num_computed_tokens: int  # leading tokens whose KV is already cached (prefix-cache hit)
    num_scheduled_tokens: int  # tokens to compute in this step
    block_ids: list[int]  # the block table
    sampling: WorkerSampling

    def to_wire(self) -> list[Any]:
        return [
            self.request_id,
            self.token_ids,
            self.num_prompt_tokens,
            self.num_computed_tokens,
            self.num_scheduled_tokens,
            self.block_ids,
            self.sampling.to_wire(),
        ]

    @classmethod
    def from_wire(cls, w: list[Any]) -> NewRequest:
        return cls(w[0], w[1], w[2], w[3], w[4], w[5], WorkerSampling.from_wire(w[6]))


@dataclass(slots=True)
class CachedRequest:
    """A request the worker already holds: only what changed."""

    request_id: str
    num_scheduled_tokens: int
    new_block_ids: list[int] = field(default_factory=list)  # appended to the block table
    replaced_blocks: list[tuple[int, int]] = field(
        default_factory=list
    )  # (logical index, new id): copy-on-write

    def to_wire(self) -> list[Any]:
        return [
            self.request_id,
            self.num_scheduled_tokens,
            self.new_block_ids,
            [list(p) for p in self.replaced_blocks],
        ]

    @classmethod
    def from_wire(cls, w: list[Any]) -> CachedRequest:
        return cls(w[0], w[1], w[2], [(int(a), int(b)) for a, b in w[3]])


@dataclass(slots=True)
class Fork:
    """After this step's sampling, `child_id` starts as a copy of `parent_id` with its own seed."""

    parent_id: str
    child_id: str
    seed: int | None

    def to_wire(self) -> list[Any]:
        return [self.parent_id, self.child_id, self.seed]

    @classmethod
    def from_wire(cls, w: list[Any]) -> Fork:
        return cls(w[0], w[1], w[2])


@dataclass(slots=True)
class Execute:
    step: int
    new_requests: list[NewRequest] = field(default_factory=list)
    cached_requests: list[CachedRequest] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # (src block, dst block)
    forks: list[Fork] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(r.num_scheduled_tokens for r in self.new_requests) + sum(
            r.num_scheduled_tokens for r in self.cached_requests
        )

    def request_ids(self) -> list[str]:
        return [r.request_id for r in self.new_requests] + [r.request_id for r in self.cached_requests]

    def to_wire(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "new": [r.to_wire() for r in self.new_requests],
            "cached": [r.to_wire() for r in self.cached_requests],
            "finished": self.finished_ids,
            "copies": [list(c) for c in self.copies],
            "forks": [f.to_wire() for f in self.forks],
        }

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> Execute:
        return cls(
            step=m["step"],
            new_requests=[NewRequest.from_wire(w) for w in m["new"]],
            cached_requests=[CachedRequest.from_wire(w) for w in m["cached"]],
            finished_ids=m["finished"],
            copies=[(int(a), int(b)) for a, b in m["copies"]],
            forks=[Fork.from_wire(w) for w in m["forks"]],
        )


@dataclass(slots=True)
class StepResult:
    """One sampled token per request that reached the end of its known tokens (children included).

    `logprobs[i]` is None unless that request asked for them; else
    `[sampled_token_logprob, [[token_id, logprob], ...top-n]]`.
    """

    step: int
    request_ids: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)  # forward_s, sample_s, step_s, ...

    def to_wire(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "ids": self.request_ids,
            "tokens": self.token_ids,
            "logprobs": self.logprobs,
            "timings": self.timings,
        }

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> StepResult:
        return cls(m["step"], m["ids"], m["tokens"], m["logprobs"], m["timings"])


# ---------------------------------------------------------------- frames


@dataclass(slots=True)
class ExecuteMessage:
    """scheduler -> worker: run this step."""

    TYPE: ClassVar[str] = "execute"

    execute: Execute

    def to_wire(self) -> dict[str, Any]:
        return {"execute": self.execute.to_wire()}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> ExecuteMessage:
        return cls(Execute.from_wire(body["execute"]))


@dataclass(slots=True)
class StepResultMessage:
    """worker -> scheduler: the tokens of the oldest step in flight."""

    TYPE: ClassVar[str] = "step_result"

    worker_id: str
    result: StepResult
    # The generation of the last `reset` the worker obeyed (0: none yet). The scheduler believes a
    # result only from the generation it activated the worker with: anything a worker computed
    # before it was declared lost and reset (a hang, a late reply) is fenced off by this number.
    generation: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id, "result": self.result.to_wire(), "generation": self.generation}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> StepResultMessage:
        return cls(body["worker_id"], StepResult.from_wire(body["result"]), int(body.get("generation", 0)))
