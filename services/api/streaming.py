"""Server-sent events exactly as OpenAI streams them: `data: {json}\n\n` per chunk, `data: [DONE]\n\n`.

Chunks go out as the scheduler's deltas arrive (no buffering). A failure after the headers are sent
can no longer change the status: it is sent as a last `data: {"error": ...}` event, as vLLM does.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.api.choices import (
    Reading,
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    usage_body,
)
from pagedserve.services.api.echo import end_offset, prompt_logprobs_body
from pagedserve.services.api.errors import APIError, from_request_error
from pagedserve.services.api.generation import Event
from pagedserve.services.api.model_card import ModelCard
from pagedserve.services.api.output_reader import OutputReader, chat_delta
from pagedserve.shared.sdk import RequestError, Result, StreamDelta

DONE = "data: [DONE]\n\n"


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


@dataclass(slots=True)
class StreamShape:
    """What every chunk of one streamed response repeats, and what it was asked for."""

    card: ModelCard
    response_id: str
    created: int
    n: int
    num_prompts: int
    include_usage: bool
    want_logprobs: bool
    echo: list[str] | None = None  # completions: the prompt text to send first, per prompt
    text_offsets: dict[int, int] = field(default_factory=dict)  # completions logprobs, per choice
    reading: Reading | None = None  # chat: tools and reasoning (None: the output is plain content)
    readers: dict[int, OutputReader] = field(default_factory=dict)
    prompt_only: bool = False  # completions echo with max_tokens 0: the generated token is not sent
    echoed: set[int] = field(default_factory=set)  # prompts whose echo went out (echo with logprobs)

    def reader(self, index: int) -> OutputReader | None:
        """The choice's reader, or None when its text is plain content (deltas go out as they are)."""
        r = self.reading
        if r is None or (not r.mode.calls_tools and r.reasoning_parser is None):
            return None
        if index not in self.readers:
            self.readers[index] = OutputReader(r.mode, r.tool_parser, r.reasoning_parser, r.think)
        return self.readers[index]

    def chunk(self, kind: str, choices: list[dict[str, Any]]) -> str:
        body: dict[str, Any] = {
            "id": self.response_id,
            "object": kind,
            "created": self.created,
            "model": self.card.name,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = None  # OpenAI: null on every chunk but the last
        return sse(body)

    def usage_chunk(self, kind: str, results: list[Result], prompt_only: bool = False) -> str:
        return sse(
            {
                "id": self.response_id,
                "object": kind,
                "created": self.created,
                "model": self.card.name,
                "choices": [],
                "usage": usage_body(results, prompt_only),
            }
        )


def _error_event(exc: BaseException) -> str:
    if isinstance(exc, RequestError):
        exc = from_request_error(exc)
    if not isinstance(exc, APIError):
        exc = APIError(500, f"{type(exc).__name__}: {exc}", None, "internal")
    return sse(exc.body())


async def chat_chunks(shape: StreamShape, events: AsyncIterator[Event]) -> AsyncIterator[str]:
    kind = "chat.completion.chunk"
    for choice in range(shape.num_prompts * shape.n):  # the first chunk of each choice names the role
        yield shape.chunk(
            kind,
            [
                {
                    "index": choice,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        )
    results: list[Result] = []
    try:
        async for prompt_index, event in events:
            if isinstance(event, StreamDelta):
                reader = shape.reader(prompt_index * shape.n + event.index)
                if reader is not None:
                    for piece in reader.feed(event.text):
                        choice = {
                            "index": prompt_index * shape.n + event.index,
                            "delta": chat_delta(piece),
                            "logprobs": None,
                            "finish_reason": None,
                        }
                        yield shape.chunk(kind, [choice])
                    continue
                logprobs = (
                    chat_logprobs(shape.card, event.token_ids, event.logprobs)
                    if shape.want_logprobs
                    else None
                )
                if event.text or logprobs:
                    choice = {
                        "index": prompt_index * shape.n + event.index,
                        "delta": {"content": event.text},
                        "logprobs": logprobs,
                        "finish_reason": None,
                    }
                    yield shape.chunk(kind, [choice])
            else:
                results.append(event)
                for out in event.outputs:
                    index = prompt_index * shape.n + out.index
                    reason = finish_reason(out.finish_reason)
                    reader = shape.reader(index)
                    if reader is not None:
                        for piece in reader.finish():
                            delta = chat_delta(piece)
                            yield shape.chunk(
                                kind,
                                [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}],
                            )
                        if reader.num_calls and reason == "stop":
                            reason = "tool_calls"
                    choice = {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}
                    yield shape.chunk(kind, [choice])
    except Exception as exc:
        yield _error_event(exc)
        yield DONE
        return
    if shape.include_usage:
        yield shape.usage_chunk(kind, results)
    yield DONE


async def completion_chunks(shape: StreamShape, events: AsyncIterator[Event]) -> AsyncIterator[str]:
    kind = "text_completion"

    def choice(index: int, text: str, logprobs: Any = None, reason: str | None = None) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    def echo_chunks(prompt_index: int, event: StreamDelta | Result) -> list[str]:
        """With logprobs, a prompt's echo waits for its logprobs: they come with its first event."""
        shape.echoed.add(prompt_index)
        assert shape.echo is not None
        logprobs, offset = None, 0
        if event.prompt_logprobs is not None:
            logprobs = prompt_logprobs_body(shape.card, event.prompt_logprobs)
            offset = end_offset(logprobs)
        first = prompt_index * shape.n
        for index in range(first, first + shape.n):
            shape.text_offsets[index] = offset
        return [
            shape.chunk(kind, [choice(i, shape.echo[prompt_index], logprobs)])
            for i in range(first, first + shape.n)
        ]

    if shape.echo is not None and not shape.want_logprobs:
        for index in range(shape.num_prompts * shape.n):
            yield shape.chunk(kind, [choice(index, shape.echo[index // shape.n])])
    results: list[Result] = []
    try:
        async for prompt_index, event in events:
            if shape.echo is not None and shape.want_logprobs and prompt_index not in shape.echoed:
                for chunk in echo_chunks(prompt_index, event):
                    yield chunk
            if isinstance(event, StreamDelta):
                if shape.prompt_only:
                    continue
                index = prompt_index * shape.n + event.index
                logprobs = None
                if shape.want_logprobs:
                    offset = shape.text_offsets.get(index, 0)
                    logprobs = completion_logprobs(shape.card, event.token_ids, event.logprobs, offset)
                    # On by the tokens' texts, as the unstreamed answer counts (a token whose text is
                    # held back, part of a character, still moves the offset there).
                    shape.text_offsets[index] = end_offset(logprobs, offset) if logprobs else offset
                if event.text or logprobs:
                    yield shape.chunk(kind, [choice(index, event.text, logprobs)])
            else:
                results.append(event)
                for out in event.outputs:
                    index = prompt_index * shape.n + out.index
                    reason = "length" if shape.prompt_only else out.finish_reason
                    yield shape.chunk(kind, [choice(index, "", None, finish_reason(reason))])
    except Exception as exc:
        yield _error_event(exc)
        yield DONE
        return
    if shape.include_usage:
        yield shape.usage_chunk(kind, results, shape.prompt_only)
    yield DONE
