"""Scheduler <-> worker hot path: `Execute` carries deltas, `StepResult` carries sampled tokens.

Declared as `msgspec.Struct(array_like=True)`: the declarations are the codec (structs.py). On the
wire each is a flat msgpack list (no field names) in the frame's body; msgspec builds and checks the
types in one pass in C, since these are built and read once per step for hundreds of requests
(ops/microbench/codec.py measures it, docs/design-notes.md has the numbers).

Worker semantics of one Execute (the order matters):
1. forget `finished_ids` (finished, aborted or preempted; their blocks are the scheduler's again);
2. add `new_requests` in full, extend `cached_requests` by their new / replaced block ids;
3. perform the copy-on-write `copies` (src block -> dst block, every layer, K and V);
4. run one forward over all scheduled tokens, packed: for each request the input tokens are
   token_ids[num_computed : num_computed + num_scheduled] (a decode's input is the worker's own
   last sampled token, so the scheduler can build step N+1 before N's result);
5. sample one token for each request whose computed tokens now reach the end of its known tokens
   (a prefill chunk that stops short of the prompt's end samples nothing); a pooling request
   (sampling.pooling) samples nothing: at its prompt's end it sends its pooled vector instead;
   a request with `sampling.prompt_logprobs` also has its prompt positions' logprobs computed, chunk
   by chunk, and sent once with its first sampled token (its prompt must be computed from token 0);
6. `forks` (n > 1): each child copies its parent's state, then samples its own first token from the
   parent's last logits with its own seed.

Speculation (docs/speculative-decoding.md): a decode with `num_lookahead` L > 0 may be extended by up
to L tokens the worker proposes itself (from its own tokens, or its draft model), so it needs nothing
the scheduler has not seen. The worker scores the last token and the p <= L proposed ones in the same
forward, keeps the longest prefix of proposals that its own sampling reproduces and one token after
it, and reports them in `StepResult.speculation`. The block table covers the L slots; the slots of
rejected proposals are rewritten by later steps.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from pagedserve.shared.protocol.constraints import StructuredOutputs
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.pooling import PooledOutput, PoolingSpec
from pagedserve.shared.protocol.prompt_logprobs import PackedPromptLogprobs


class WorkerSampling(msgspec.Struct, array_like=True, frozen=True):
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
    prompt_logprobs: int | None  # None once received (or for a child): never computed twice
    pooling: PoolingSpec | None = None  # a prefill-only request: pooled, never sampled (pooling.py)

    @classmethod
    def of(
        cls, params: SamplingParams, seed: int | None, with_prompt_logprobs: bool = True
    ) -> WorkerSampling:
        """`with_prompt_logprobs=False` for a request whose prompt logprobs the worker already sent."""
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
            params.prompt_logprobs if with_prompt_logprobs else None,
            None if params.pooling is None else PoolingSpec.of(params.pooling),
        )

    @property
    def has_penalty(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def with_seed(self, seed: int | None) -> WorkerSampling:
        return msgspec.structs.replace(self, seed=seed)


class NewRequest(msgspec.Struct, array_like=True):
    """A request the worker has not seen (or must recompute after preemption / a lost worker)."""

    request_id: str
    token_ids: list[int]  # every known token: prompt, then outputs so far (recompute)
    num_prompt_tokens: int  # token_ids[:num_prompt_tokens] is the prompt (penalties need it)
    num_computed_tokens: int  # leading tokens whose KV is already cached (prefix-cache hit)
    num_scheduled_tokens: int  # tokens to compute in this step
    block_ids: list[int]  # the block table
    sampling: WorkerSampling
    # The LoRA adapter this request runs with (None: the base model) and where it is read from, so a
    # worker that never saw it (a fresh or restarted one) loads it before computing the request.
    lora_name: str | None = None
    lora_path: str | None = None


class CachedRequest(msgspec.Struct, array_like=True):
    """A request the worker already holds: only what changed."""

    request_id: str
    num_scheduled_tokens: int
    new_block_ids: list[int] = []  # appended to the block table
    replaced_blocks: list[tuple[int, int]] = []  # (logical index, new id): copy-on-write
    num_lookahead: int = 0  # a decode: at most this many proposed tokens may be verified with it


class Fork(msgspec.Struct, array_like=True):
    """After this step's sampling, `child_id` starts as a copy of `parent_id` with its own seed."""

    parent_id: str
    child_id: str
    seed: int | None


class Execute(msgspec.Struct, array_like=True):
    step: int
    new_requests: list[NewRequest] = []
    cached_requests: list[CachedRequest] = []
    finished_ids: list[str] = []
    copies: list[tuple[int, int]] = []  # (src block, dst block)
    forks: list[Fork] = []
    # LoRA adapters (name, path) a waiting request needs: read them off the step path, and say so in
    # StepResult.loras_ready; the request is scheduled once they are (services/worker/lora_slots.py).
    prefetch_loras: list[tuple[str, str]] = []

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(r.num_scheduled_tokens for r in self.new_requests) + sum(
            r.num_scheduled_tokens for r in self.cached_requests
        )

    def request_ids(self) -> list[str]:
        return [r.request_id for r in self.new_requests] + [r.request_id for r in self.cached_requests]


class Speculated(msgspec.Struct, array_like=True):
    """What a speculating decode gave beyond its first token (`StepResult.token_ids[row]`)."""

    row: int  # index into StepResult.request_ids
    num_proposed: int  # tokens proposed and scored (<= the step's num_lookahead)
    # The tokens after the first: each but the last was a proposal the step accepted (the first token
    # too, when this list is not empty), the last is the target's own token after them.
    more_token_ids: list[int]
    more_logprobs: list[Any] | None = None  # one per more_token_ids entry when the request asked


class StepResult(msgspec.Struct, array_like=True):
    """One sampled token per request that reached the end of its known tokens (children included).

    `logprobs[i]` is None unless that request asked for them; else
    `[sampled_token_logprob, [[token_id, logprob], ...top-n]]`. `prompt_logprobs`: those of the
    requests that asked (sampling.prompt_logprobs) and sampled their first token in this step.
    `speculation`: one entry per request that proposed tokens in this step (none without speculation);
    `len(more_token_ids)` of them were accepted.
    """

    step: int
    request_ids: list[str] = []
    token_ids: list[int] = []
    logprobs: list[Any] | None = None
    timings: dict[str, float] = {}  # forward_s, sample_s, step_s, ...
    prompt_logprobs: list[PackedPromptLogprobs] = []  # empty on nearly every step
    speculation: list[Speculated] = []
    # Pooling requests that computed their prompt's end: a vector each, and no entry in request_ids.
    pooled: list[PooledOutput] = []
    # The LoRA adapters (name, path) this worker holds parsed: what the scheduler may schedule without
    # a read inside the step. None: a worker without adapter slots (or one that does not report them).
    loras_ready: list[tuple[str, str]] | None = None
    # Reads asked for (Execute.prefetch_loras) that failed since the last result, each once: (name, path,
    # the error naming the file or module). The scheduler ends the requests waiting on them.
    loras_failed: list[tuple[str, str, str]] = []


# ---------------------------------------------------------------- frames


class ExecuteMessage(msgspec.Struct):
    """scheduler -> worker: run this step."""

    TYPE: ClassVar[str] = "execute"

    execute: Execute


class StepResultMessage(msgspec.Struct):
    """worker -> scheduler: the tokens of the oldest step in flight."""

    TYPE: ClassVar[str] = "step_result"

    worker_id: str
    result: StepResult
    # The generation of the last `reset` the worker obeyed (0: none yet). The scheduler believes a
    # result only from the generation it activated the worker with: anything a worker computed
    # before it was declared lost and reset (a hang, a late reply) is fenced off by this number.
    generation: int = 0
