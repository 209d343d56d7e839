"""A streamed response: OpenAI's event sequence as server-sent events, each with its sequence number.

response.created, response.in_progress,
per output item: response.output_item.added, response.content_part.added,
    response.output_text.delta | response.reasoning_text.delta | response.function_call_arguments.delta ...,
    the matching .done events, response.output_item.done,
then response.completed (or response.incomplete: cut by max_output_tokens, or cancelled;
response.failed with the error when the request failed after the stream began).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pagedserve.services.api.errors import APIError, from_request_error
from pagedserve.services.api.generation import Event
from pagedserve.services.api.output_reader import OutputReader
from pagedserve.services.api.responses.body import OutputItems
from pagedserve.shared.sdk import RequestError, Result, StreamDelta

FINAL_EVENTS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "cancelled": "response.incomplete",
}


def _error_body(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, RequestError):
        exc = from_request_error(exc, "input")
    if isinstance(exc, APIError):
        return {"code": exc.code or "error", "message": exc.message}
    return {"code": "server_error", "message": f"{type(exc).__name__}: {exc}"}


async def _close_when(cancelled: asyncio.Event, close: Callable[[], Awaitable[None]]) -> None:
    await cancelled.wait()
    await close()


async def response_events(
    started: dict[str, Any],
    reader: OutputReader,
    events: AsyncIterator[Event],
    cancelled: asyncio.Event,
    close: Callable[[], Awaitable[None]],
    finish: Callable[[OutputItems, Result | None, str], dict[str, Any]],
    status_of: Callable[[Result], str],
) -> AsyncIterator[str]:
    numbers = itertools.count()

    def sse(event: dict[str, Any]) -> str:
        event["sequence_number"] = next(numbers)
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n"

    yield sse({"type": "response.created", "response": started})
    yield sse({"type": "response.in_progress", "response": started})
    output = OutputItems()
    watcher = asyncio.create_task(_close_when(cancelled, close))  # /cancel aborts the requests
    result: Result | None = None
    try:
        async for _, event in events:
            if isinstance(event, StreamDelta):
                for piece in reader.feed(event.text):
                    for out in output.add(piece):
                        yield sse(out)
            else:
                result = event
    except Exception as exc:
        final = finish(output, None, "failed")
        yield sse({"type": "response.failed", "response": {**final, "error": _error_body(exc)}})
        return
    finally:
        watcher.cancel()
    if result is None and not cancelled.is_set():
        finish(output, None, "failed")  # the client hung up: nobody reads on
        return
    status = "cancelled" if result is None else status_of(result)
    if result is not None:
        for piece in reader.finish():
            for out in output.add(piece):
                yield sse(out)
    for out in output.end("incomplete" if status == "incomplete" else "completed"):
        yield sse(out)
    yield sse({"type": FINAL_EVENTS[status], "response": finish(output, result, status)})
