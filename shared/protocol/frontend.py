"""Client SDK <-> scheduler messages. A trust boundary: every field is validated on arrival.

Requests: Submit, Abort, Ping, StopAt (and a router's Locate). Replies: Accepted, Delta, Finished, Error, Pong
(and Location).
Unknown fields are errors (extra="forbid"), so a typo in a sampling field is never silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from pagedserve.shared.protocol.constraints import StructuredOutputs
from pagedserve.shared.protocol.pooling import PoolingParams
from pagedserve.shared.protocol.prompt_logprobs import PromptLogprobs

MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20
MAX_N = 16
MAX_LOGIT_BIAS = 300
MAX_SPECULATIVE_TOKENS = 16  # a request's own cap on proposals per step (the deployment's is at most this)

RequestId = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingParams(_Strict):
    """How to sample one request. `temperature=0` is greedy. Higher `priority` runs first."""

    n: int = Field(
        default=1, ge=1, le=MAX_N, description="completions of the same prompt (share its KV blocks)"
    )
    max_tokens: int = Field(default=16, ge=1, le=1 << 20, description="most tokens to generate")
    min_tokens: int = Field(
        default=0, ge=0, description="EOS and stop ids are masked until this many are generated"
    )
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_k: int = Field(default=0, ge=0, description="0 = off")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = Field(
        default=None, ge=0, lt=1 << 63, description="same seed, same tokens, whatever the batch"
    )
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stop: list[Annotated[str, StringConstraints(min_length=1, max_length=256)]] = Field(
        default_factory=list, max_length=MAX_STOP_STRINGS
    )
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=64)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS, description="top-n logprobs per token")
    prompt_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_LOGPROBS,
        description="the prompt's own token logprobs and top-n per position (the whole prompt is computed)",
    )
    priority: int = Field(
        default=0, ge=-1000, le=1000, description="higher runs first; victims of preemption are lowest"
    )
    structured_outputs: StructuredOutputs | None = Field(
        default=None, description="the output must match this JSON schema / regex / choice / grammar"
    )
    logit_bias: dict[Annotated[int, Field(ge=0)], Annotated[float, Field(ge=-100.0, le=100.0)]] | None = (
        Field(
            default=None,
            max_length=MAX_LOGIT_BIAS,
            description="token id -> added to its logit before sampling",
        )
    )
    pooling: PoolingParams | None = Field(
        default=None,
        description="prefill only: the prompt pooled into one vector, no token sampled (pooling.py)",
    )
    speculate: bool = Field(
        default=True,
        description="false: no speculative decoding for this request, even where the deployment has it",
    )
    num_speculative_tokens: int | None = Field(
        default=None,
        ge=0,
        le=MAX_SPECULATIVE_TOKENS,
        description="most tokens proposed per step for this request (0: none); the deployment's "
        "num_speculative_tokens caps it; None: the deployment's",
    )

    @model_validator(mode="after")
    def _min_below_max(self) -> SamplingParams:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.structured_outputs is not None and self.ignore_eos:
            # The grammar ends generation by allowing only EOS; ignoring EOS would run past its end.
            raise ValueError("ignore_eos cannot be combined with structured_outputs")
        if self.pooling is not None:
            sampled = [
                name
                for name, on in (
                    ("n", self.n != 1),
                    ("logprobs", self.logprobs is not None),
                    ("prompt_logprobs", self.prompt_logprobs is not None),
                    ("structured_outputs", self.structured_outputs is not None),
                )
                if on
            ]
            if sampled:
                raise ValueError(f"pooling samples no token: it takes no {', '.join(sampled)}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# ---------------------------------------------------------------- client -> scheduler


class Submit(_Strict):
    type: Literal["submit"] = "submit"
    request_id: RequestId
    prompt: str | None = Field(default=None, max_length=1 << 20)
    prompt_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, max_length=1 << 20)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    stream: bool = True
    timeout_s: float | None = Field(default=None, gt=0.0, le=86400.0)
    # Whom the request is for (an API's end user): per-client limits count per user when given, so
    # the users behind one API process do not share one budget. None: the connection is the client.
    user: str | None = Field(default=None, min_length=1, max_length=256)
    # A reconnecting client re-submits with attach=True: a live request streams to the new connection
    # (from token 0 again: the client drops what it has by `offset`); a finished one returns its result.
    attach: bool = False
    # The LoRA adapter to run with, by its served name (`--lora-modules`, /v1/load_lora_adapter);
    # None: the base model.
    lora: str | None = Field(default=None, min_length=1, max_length=256)
    # False: the client makes the text itself (the SDK given a tokenizer; shared/completion_text.py)
    # and holds the stop strings: the scheduler sends token ids only, with empty text, and a stop
    # string the client finds ends the completion by StopAt. Text work leaves the scheduler's thread.
    detokenize: bool = True

    @model_validator(mode="after")
    def _exactly_one_prompt(self) -> Submit:
        if (self.prompt is None) == (self.prompt_token_ids is None):
            raise ValueError("give exactly one of 'prompt' or 'prompt_token_ids'")
        if self.prompt_token_ids is not None and not self.prompt_token_ids:
            raise ValueError("'prompt_token_ids' must not be empty")
        if self.prompt is not None and not self.prompt:
            raise ValueError("'prompt' must not be empty")
        return self


class Abort(_Strict):
    type: Literal["abort"] = "abort"
    request_id: RequestId


class Ping(_Strict):
    """Client heartbeat: its live requests stay alive while pings arrive."""

    type: Literal["ping"] = "ping"


class StopAt(_Strict):
    """A stop string ended completion `index` at its `num_tokens`-th output token (found by a client
    that makes its own text): the scheduler ends it there with finish_reason "stop", dropping any
    tokens it made past that point. Ignored when the completion has ended, or has fewer tokens (after
    a recompute: the client says it again once it sees them)."""

    type: Literal["stop_at"] = "stop_at"
    request_id: RequestId
    index: int = Field(default=0, ge=0, lt=MAX_N)
    num_tokens: int = Field(ge=1)


class Locate(_Strict):
    """Does this scheduler hold the request? A router asks every shard when it does not know the owner
    (its table is soft state: gone after its own restart)."""

    type: Literal["locate"] = "locate"
    request_id: RequestId


# ---------------------------------------------------------------- scheduler -> client


class Accepted(_Strict):
    type: Literal["accepted"] = "accepted"
    request_id: str
    num_prompt_tokens: int


class Delta(_Strict):
    """New tokens of one completion (`index` < n) and the text they add.

    `offset` / `text_offset`: where they start in the completion's output, so a client that was sent
    a replay after reconnecting keeps exactly what it did not have."""

    type: Literal["delta"] = "delta"
    request_id: str
    index: int = 0
    offset: int = 0
    text_offset: int = 0
    token_ids: list[int]
    text: str
    logprobs: list[Any] | None = None
    # On the first delta of completion 0 (and on a replay's): what sampling.prompt_logprobs asked for.
    prompt_logprobs: PromptLogprobs | None = None


class CompletionOutput(_Strict):
    index: int
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[Any] | None = None


class Usage(_Strict):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


class Finished(_Strict):
    type: Literal["finished"] = "finished"
    request_id: str
    outputs: list[CompletionOutput]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = None
    pooled: bytes | None = None  # sampling.pooling: the vector, float32 little-endian (pooling.py)


class Error(_Strict):
    """Any refusal or failure. `code` is stable and machine-readable; `message` names the field and limit."""

    type: Literal["error"] = "error"
    code: str
    message: str
    request_id: str | None = None


class Pong(_Strict):
    type: Literal["pong"] = "pong"


class Location(_Strict):
    """The answer to Locate: `live` (running or waiting here), `finished` (its result is kept here) or
    `unknown`."""

    type: Literal["location"] = "location"
    request_id: str
    state: Literal["live", "finished", "unknown"]


CLIENT_MESSAGES: dict[str, type[_Strict]] = {
    m.model_fields["type"].default: m for m in (Submit, Abort, Ping, StopAt, Locate)
}
SERVER_MESSAGES: dict[str, type[_Strict]] = {
    m.model_fields["type"].default: m for m in (Accepted, Delta, Finished, Error, Pong, Location)
}
