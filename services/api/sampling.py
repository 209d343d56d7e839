"""OpenAI request -> what the scheduler runs: our SamplingParams and one prompt per Submit.

Every limit is SamplingParams' own (one place); a value it refuses becomes a 400 naming the
request's field, under OpenAI's name for it (`top_logprobs`, `max_completion_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from pagedserve.services.api.errors import APIError, from_validation_error
from pagedserve.services.api.schemas import ChatCompletionRequest, CompletionRequest, _Sampling
from pagedserve.services.api.structured import Constraint, request_constraint
from pagedserve.shared.protocol.frontend import SamplingParams

# OpenAI defaults where ours differ (ours: temperature 1.0, max_tokens 16 as well).
_PASSED_IF_SET = (
    "temperature",
    "top_p",
    "n",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
    "priority",
    "speculate",
    "num_speculative_tokens",
)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt of a request: text (the scheduler tokenizes it) or token ids."""

    text: str | None = None
    token_ids: list[int] | None = None


def _logit_bias(bias: dict[str, float]) -> dict[int, float]:
    try:
        return {int(token): value for token, value in bias.items()}
    except ValueError:
        bad = next(t for t in bias if not t.lstrip("-").isdigit())
        raise APIError(
            400, f"logit_bias: keys must be token ids; got {bad!r}", "logit_bias", "invalid_value"
        ) from None


def _common(req: _Sampling, constraint: Constraint | None) -> dict[str, Any]:
    fields = {name: getattr(req, name) for name in _PASSED_IF_SET if getattr(req, name) is not None}
    if req.logit_bias:
        fields["logit_bias"] = _logit_bias(req.logit_bias)
    constraint = constraint or request_constraint(req)
    if constraint is not None:
        fields["structured_outputs"] = constraint.spec
    if req.stop is not None:
        fields["stop"] = [req.stop] if isinstance(req.stop, str) else req.stop
    fields["ignore_eos"] = req.ignore_eos
    fields["include_stop_str_in_output"] = req.include_stop_str_in_output
    return fields


def _build(fields: dict[str, Any], rename: dict[str, str] | None = None) -> SamplingParams:
    try:
        return SamplingParams(**fields)
    except ValidationError as exc:
        raise from_validation_error(exc, rename) from None


def completion_sampling(req: CompletionRequest, constraint: Constraint | None = None) -> SamplingParams:
    if req.suffix is not None:
        raise APIError(400, "suffix is not supported yet", "suffix", "unsupported")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(400, "best_of other than n is not supported yet", "best_of", "unsupported")
    fields = _common(req, constraint)
    rename = {}
    if req.max_tokens is not None:
        fields["max_tokens"] = req.max_tokens
    if asks_prompt_only(req):
        fields["max_tokens"] = 1  # the core samples one token; the answer leaves it out (echo.py)
    if req.logprobs is not None:
        fields["logprobs"] = req.logprobs
        if req.echo:  # the prompt's logprobs too, the same top-n (and the same limit)
            fields["prompt_logprobs"] = req.logprobs
            rename["prompt_logprobs"] = "logprobs"
    return _build(fields, rename)


def asks_prompt_only(req: CompletionRequest) -> bool:
    """echo with max_tokens 0: the prompt (and its logprobs) alone, as lm-eval's loglikelihood asks."""
    return req.echo and req.max_tokens == 0


def completion_prompts(req: CompletionRequest) -> list[Prompt]:
    """A string, a list of strings, a list of token ids or a list of lists: one Prompt each."""
    p = req.prompt
    if isinstance(p, str):
        prompts = [Prompt(text=p)]
    elif p and all(isinstance(x, int) for x in p):
        prompts = [Prompt(token_ids=[x for x in p if isinstance(x, int)])]  # all of them: checked above
    else:
        prompts = [
            Prompt(text=x) if isinstance(x, str) else Prompt(token_ids=list(x))
            for x in p
            if not isinstance(x, int)  # (none is: a mix of ids and lists fails the schema)
        ]
    if not prompts:
        raise APIError(400, "prompt: must not be empty", "prompt", "invalid_value")
    for i, one in enumerate(prompts):
        if not (one.text or one.token_ids):
            raise APIError(400, f"prompt[{i}]: must not be empty", "prompt", "invalid_value")
    return prompts


def chat_sampling(
    req: ChatCompletionRequest,
    num_prompt_tokens: int,
    max_model_len: int,
    constraint: Constraint | None = None,
) -> SamplingParams:
    """`constraint`: the request's (tools.chat_constraint); None: read from its format fields."""
    fields = _common(req, constraint)
    rename = {}
    if req.max_completion_tokens is not None:
        fields["max_tokens"] = req.max_completion_tokens
        rename["max_tokens"] = "max_completion_tokens"
    elif req.max_tokens is not None:
        fields["max_tokens"] = req.max_tokens
    else:
        # OpenAI's chat default is "until the context is full".
        fields["max_tokens"] = max(1, max_model_len - num_prompt_tokens)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs", "invalid_value")
    if req.logprobs:
        fields["logprobs"] = req.top_logprobs or 0
        rename["logprobs"] = "top_logprobs"
    return _build(fields, rename)
