"""Our results in OpenAI's response shapes: choices, logprobs, usage (non-streamed and streamed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedserve.services.api.echo import end_offset, joined, prompt_logprobs_body
from pagedserve.services.api.model_card import ModelCard
from pagedserve.services.api.output_reader import read_whole
from pagedserve.services.api.reasoning import ThinkState
from pagedserve.services.api.tools import ToolMode
from pagedserve.shared.protocol.prompt_logprobs import PromptLogprobs
from pagedserve.shared.sdk import Completion, Result

# The scheduler's finish reasons are OpenAI's ("stop": EOS, a stop id or string; "length":
# max_tokens or the context); "abort" only reaches a client that is already gone.
NO_TOOLS = ToolMode("none")

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}


def finish_reason(reason: str) -> str:
    return FINISH_REASONS.get(reason, reason)


def usage_body(results: list[Result], prompt_only: bool = False) -> dict[str, Any]:
    """prompt_only: echo with max_tokens 0, whose one generated token is not part of the answer."""
    prompt = sum(r.num_prompt_tokens for r in results)
    completion = 0 if prompt_only else sum(r.usage.completion_tokens for r in results)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(r.usage.cached_tokens for r in results)},
    }


def _top(card: ModelCard, entry: list[Any]) -> list[tuple[int, str, float]]:
    """One SDK logprob entry `[sampled_logprob, [[token_id, logprob], ...best first]]` -> its top list."""
    return [(int(tid), card.token_text(int(tid)), float(lp)) for tid, lp in entry[1]]


# ---------------------------------------------------------------- chat


def chat_logprobs(card: ModelCard, token_ids: list[int], logprobs: list[Any] | None) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    content = []
    for tid, entry in zip(token_ids, logprobs, strict=False):
        token = card.token_text(tid)
        content.append(
            {
                "token": token,
                "logprob": float(entry[0]),
                "bytes": card.token_bytes(tid),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": card.token_bytes(i)}
                    for i, t, lp in _top(card, entry)
                ],
            }
        )
    return {"content": content, "refusal": None}


@dataclass(frozen=True, slots=True)
class Reading:
    """How a chat request's output is read: its tool mode, the tool-call and reasoning parsers, and
    how the prompt left the thinking block (chat_plan.py)."""

    mode: ToolMode = NO_TOOLS
    tool_parser: str = "hermes"
    reasoning_parser: str | None = None
    think: ThinkState | None = None


def chat_message(
    text: str, mode: ToolMode, parser: str, reading: Reading | None = None
) -> tuple[str | None, list[dict[str, Any]], str | None]:
    """A completion's text -> the message's content, tool calls and reasoning, as `mode` reads it."""
    reading = reading or Reading(mode, parser)
    reasoning, content, calls = read_whole(text, mode, parser, reading.reasoning_parser, reading.think)
    bodies = [{"id": cid, "type": "function", "function": {"name": n, "arguments": a}} for cid, n, a in calls]
    return ((content or None) if calls else content), bodies, reasoning


def chat_choice(
    card: ModelCard,
    index: int,
    out: Completion,
    want_logprobs: bool,
    reading: Reading = Reading(),
) -> dict[str, Any]:
    content, calls, reasoning = chat_message(out.text, reading.mode, reading.tool_parser, reading)
    reason = finish_reason(out.finish_reason)
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "tool_calls": calls}
    if reading.reasoning_parser is not None:
        message["reasoning_content"] = message["reasoning"] = reasoning  # vLLM's name, and the newer one
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(card, out.token_ids, out.logprobs) if want_logprobs else None,
        "finish_reason": "tool_calls" if calls and reason == "stop" else reason,
    }


# ---------------------------------------------------------------- completions


def completion_logprobs(
    card: ModelCard, token_ids: list[int], logprobs: list[Any] | None, text_offset: int = 0
) -> dict[str, Any] | None:
    """The legacy completions shape: parallel lists, top_logprobs as {token: logprob} maps."""
    if logprobs is None:
        return None
    tokens, token_logprobs, tops, offsets = [], [], [], []
    offset = text_offset
    for tid, entry in zip(token_ids, logprobs, strict=False):
        token = card.token_text(tid)
        tokens.append(token)
        token_logprobs.append(float(entry[0]))
        tops.append(card.top_map((tid, lp) for tid, _, lp in _top(card, entry)))
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def completion_choice(
    card: ModelCard,
    index: int,
    out: Completion,
    echo: str | None,
    want_logprobs: bool,
    prompt: PromptLogprobs | None = None,
) -> dict[str, Any]:
    """`prompt`: echo with logprobs, the prompt's logprobs go first (echo.py)."""
    logprobs = None
    if want_logprobs:
        head = prompt_logprobs_body(card, prompt) if prompt is not None else None
        offset = end_offset(head) if head is not None else len(echo or "")
        logprobs = joined(head, completion_logprobs(card, out.token_ids, out.logprobs, offset))
    return {
        "index": index,
        "text": (echo or "") + out.text,
        "logprobs": logprobs,
        "finish_reason": finish_reason(out.finish_reason),
    }
