"""The response object and its output items, built piece by piece from the output reader.

`OutputItems` turns pieces (reasoning, text, tool calls) into output items and, on the way, into the
streaming events OpenAI documents for each: an item is `added`, grows by deltas, and is `done` when
the next kind of piece begins or the output ends. An unstreamed response is built by the same class,
its events dropped, so both carry the same items.
"""

from __future__ import annotations

import uuid
from typing import Any

from pagedserve.services.api.output_reader import Piece
from pagedserve.services.api.responses.schemas import ResponsesRequest

Event = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItems:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._text = ""  # the open item's text (message, reasoning) or arguments (function call)

    def add(self, piece: Piece) -> list[Event]:
        events: list[Event] = []
        kind = {"text": "message", "reasoning": "reasoning", "call": "function_call"}.get(piece.kind)
        if kind is not None and (self._open is None or self._open["type"] != kind or piece.kind == "call"):
            events += self.close("completed")
            events += self._start(kind, piece)
        assert self._open is not None, f"{piece.kind} without an open item"
        if piece.text:
            self._text += piece.text
            events.append(self._delta(piece.text))
        return events

    def end(self, status: str) -> list[Event]:
        """The output is over: the open item is done (an output with no item gets an empty message)."""
        events = [] if self.items else self._start("message", Piece("text"))
        return events + self.close(status)

    def _start(self, kind: str, piece: Piece) -> list[Event]:
        index = len(self.items)
        if kind == "message":
            item: dict[str, Any] = {
                "id": new_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            part: dict[str, Any] | None = {
                "type": "output_text",
                "text": "",
                "annotations": [],
                "logprobs": [],
            }
        elif kind == "reasoning":
            item = {
                "id": new_id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {
                "id": new_id("fc"),
                "type": "function_call",
                "call_id": piece.call_id,
                "name": piece.name,
                "arguments": "",
                "status": "in_progress",
            }
            part = None
        self.items.append(item)
        self._open, self._text = item, ""
        events: list[Event] = [
            {"type": "response.output_item.added", "output_index": index, "item": dict(item)}
        ]
        if part is not None:
            events.append(
                {
                    "type": "response.content_part.added",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "part": part,
                }
            )
        return events

    def _delta(self, text: str) -> Event:
        item = self._open
        assert item is not None
        where = {"item_id": item["id"], "output_index": len(self.items) - 1}
        if item["type"] == "message":
            return {
                "type": "response.output_text.delta",
                **where,
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            }
        if item["type"] == "reasoning":
            return {"type": "response.reasoning_text.delta", **where, "content_index": 0, "delta": text}
        return {"type": "response.function_call_arguments.delta", **where, "delta": text}

    def close(self, status: str) -> list[Event]:
        """The open item is done (`status`: completed, or incomplete when the output was cut)."""
        item, text = self._open, self._text
        if item is None:
            return []
        self._open, self._text = None, ""
        where = {"item_id": item["id"], "output_index": len(self.items) - 1}
        item["status"] = status
        events: list[Event] = []
        if item["type"] == "function_call":
            item["arguments"] = text
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "arguments": text,
                    "name": item["name"],
                }
            )
        else:
            message = item["type"] == "message"
            part = (
                {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                if message
                else {"type": "reasoning_text", "text": text}
            )
            item["content"] = [part]
            done = "response.output_text.done" if message else "response.reasoning_text.done"
            events.append(
                {
                    "type": done,
                    **where,
                    "content_index": 0,
                    "text": text,
                    **({"logprobs": []} if message else {}),
                }
            )
            events.append({"type": "response.content_part.done", **where, "content_index": 0, "part": part})
        events.append(
            {"type": "response.output_item.done", "output_index": where["output_index"], "item": item}
        )
        return events


def response_body(
    body: ResponsesRequest,
    response_id: str,
    created: int,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object, echoing the request's settings as OpenAI does."""
    text = (
        body.text.model_dump(by_alias=True, exclude_none=True) if body.text else {"format": {"type": "text"}}
    )
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
        "previous_response_id": body.previous_response_id,
        "reasoning": body.reasoning or {"effort": None, "summary": None},
        "store": body.store,
        "temperature": body.temperature if body.temperature is not None else 1.0,
        "text": text,
        "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [],
        "top_p": body.top_p if body.top_p is not None else 1.0,
        "truncation": body.truncation or "disabled",
        "usage": usage,
        "user": body.user,
        "metadata": body.metadata or {},
    }


def usage_body(
    prompt_tokens: int, output_tokens: int, cached_tokens: int, reasoning_tokens: int = 0
) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": prompt_tokens + output_tokens,
    }
