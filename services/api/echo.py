"""`echo` with `logprobs` on /v1/completions: the prompt's tokens and logprobs ahead of the completion's.

The scheduler computes them (SamplingParams.prompt_logprobs, the same top-n as `logprobs`) from the
prefill it runs anyway. In OpenAI's legacy shape the prompt's tokens come first in `tokens`,
`token_logprobs` (the first is null: nothing precedes it) and `top_logprobs` (null there too), and
`text_offset` counts on through the completion's tokens.

`max_tokens: 0` with echo (lm-eval's loglikelihood requests) asks for the prompt alone: the core
always samples a first token, so one is generated and left out of the answer (and of its usage).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pagedserve.services.api.model_card import ModelCard
from pagedserve.shared.protocol.prompt_logprobs import PromptLogprobs
from pagedserve.shared.sdk import Completion


def prompt_logprobs_body(card: ModelCard, prompt: PromptLogprobs) -> dict[str, Any]:
    """The prompt's part of a completions `logprobs` object (offsets from 0)."""
    tokens = [card.token_text(t) for t in prompt.token_ids]
    tops: list[dict[str, float] | None] = [card.top_map(top) for top in prompt.top()]
    tops[0] = None
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": prompt.logprobs(),
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def end_offset(body: dict[str, Any], start: int = 0) -> int:
    """Where the text after these tokens starts (the next text_offset); `start` when there are none."""
    if not body["tokens"]:
        return start
    return body["text_offset"][-1] + len(body["tokens"][-1])


def joined(prompt: dict[str, Any] | None, completion: dict[str, Any] | None) -> dict[str, Any] | None:
    """Prompt part, then completion part, list by list."""
    if prompt is None or completion is None:
        return prompt or completion
    return {key: prompt[key] + completion[key] for key in prompt}


def without_generated(out: Completion) -> Completion:
    """max_tokens 0: the completion without its one generated token."""
    return replace(
        out, token_ids=[], text="", finish_reason="length", logprobs=[] if out.logprobs is not None else None
    )
