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
   a request with `sampling.prompt_logprobs` also has its prompt positions' logprobs computed, chunk
   by chunk, and sent once with its first sampled token (its prompt must be computed from token 0);
6. `forks` (n > 1): each child copies its parent's state, then samples its own first token from the
   parent's last logits with its own seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pagedserve.shared.protocol.prompt_logprobs import PackedPromptLogprobs


@dataclass(slots=True)
class NewRequest:
    """A request the worker has not seen (or must recompute after preemption / a lost worker)."""

    request_id: str
    token_ids: list[int]  # every known token: prompt, then outputs so far (recompute)
    num_prompt_tokens: int  # token_ids[:num_prompt_tokens] is the prompt (penalties need it)
    num_computed_tokens: int  # leading tokens whose KV is already cached (prefix-cache hit)
    num_scheduled_tokens: int  # tokens to compute in this step
    block_ids: list[int]  # the block table
    sampling: dict[str, Any]  # SamplingParams fields (model_dump) the sampler reads

    def to_wire(self) -> list[Any]:
        return [
            self.request_id,
            self.token_ids,
            self.num_prompt_tokens,
            self.num_computed_tokens,
            self.num_scheduled_tokens,
            self.block_ids,
            self.sampling,
        ]

    @classmethod
    def from_wire(cls, w: list[Any]) -> NewRequest:
        return cls(w[0], w[1], w[2], w[3], w[4], w[5], w[6])


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
    `[sampled_token_logprob, [[token_id, logprob], ...top-n]]`. `prompt_logprobs`: those of the
    requests that asked (sampling.prompt_logprobs) and sampled their first token in this step.
    """

    step: int
    request_ids: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)  # forward_s, sample_s, step_s, ...
    prompt_logprobs: list[PackedPromptLogprobs] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "step": self.step,
            "ids": self.request_ids,
            "tokens": self.token_ids,
            "logprobs": self.logprobs,
            "timings": self.timings,
        }
        if self.prompt_logprobs:  # absent from nearly every step
            wire["prompt_logprobs"] = [p.to_wire() for p in self.prompt_logprobs]
        return wire

    @classmethod
    def from_wire(cls, m: dict[str, Any]) -> StepResult:
        prompt = [PackedPromptLogprobs.from_wire(w) for w in m.get("prompt_logprobs", ())]
        return cls(m["step"], m["ids"], m["tokens"], m["logprobs"], m["timings"], prompt)


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
