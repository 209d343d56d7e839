"""POST /v1/messages (streamed or not) and /v1/messages/count_tokens, in Anthropic's shapes.

A message is a chat request (convert.py -> chat_plan.py) read by the same output reader as chat:
thinking (with --reasoning-parser), text, tool calls; they become content blocks (body.py). Errors
are Anthropic's `{"type": "error", "error": {"type", "message"}}` (errors.py knows the path).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from pagedserve.services.api.chat_plan import ChatPlan, plan_chat
from pagedserve.services.api.errors import APIError, anthropic_error_body, as_api_errors, from_request_error
from pagedserve.services.api.generation import Event, Fanout, generate_all
from pagedserve.services.api.messages.body import (
    ContentBlocks,
    message_body,
    message_id,
    stop_reason,
    usage_body,
)
from pagedserve.services.api.messages.convert import chat_request
from pagedserve.services.api.messages.schemas import CountTokensRequest, MessagesRequest
from pagedserve.services.api.messages.stop import StopCutter
from pagedserve.services.api.output_reader import OutputReader
from pagedserve.services.api.sampling import Prompt
from pagedserve.services.api.state import (
    APIState,
    caller,
    run_unless_disconnected,
    serving_state,
    stream_response,
)
from pagedserve.services.api.structured import constraint_errors
from pagedserve.shared.sdk import RequestError, Result, StreamDelta

router = APIRouter()


def _plan(request: Request, body: CountTokensRequest, stream: bool = False) -> tuple[APIState, ChatPlan]:
    state = serving_state(request, body.model, "generate", "/v1/messages")
    return state, plan_chat(state, chat_request(body, stream))


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, int]:
    _, plan = _plan(request, body)
    return {"input_tokens": len(plan.token_ids)}


@router.post("/v1/messages", response_model=None)
async def create_message(body: MessagesRequest, request: Request) -> dict[str, Any] | Response:
    state, plan = _plan(request, body, body.stream)
    user = body.user_profile_id or (body.metadata or {}).get("user_id")
    who = caller(request, user[:256] if isinstance(user, str) and user else None)
    prompts = [Prompt(token_ids=plan.token_ids)]
    mid = message_id()
    with constraint_errors(plan.constraint):
        if body.stream:
            with as_api_errors("messages"):
                fanout = await Fanout.open(state.client, prompts, plan.sampling, mid, who)
            reader = _reader(state, plan)
            cutter = StopCutter(body.stop_sequences)
            return await stream_response(
                request,
                fanout,
                lambda events: _events(state, mid, len(plan.token_ids), reader, cutter, events),
                "messages",
            )
        work = generate_all(state.client, prompts, plan.sampling, mid, who)
        (result,) = await run_unless_disconnected(request, work, "messages")
    cutter = StopCutter(body.stop_sequences)
    reader = _reader(state, plan)
    blocks = ContentBlocks()
    text = cutter.feed(result.text) + cutter.finish(result.finish_reason == "stop")
    for piece in reader.feed(text) + reader.finish():
        blocks.add(piece)
    blocks.close()
    reason = stop_reason(result.finish_reason, blocks.calls_tools, cutter.matched)
    return message_body(mid, state.card.name, blocks.blocks, reason, cutter.matched, _usage(result))


def _reader(state: APIState, plan: ChatPlan) -> OutputReader:
    return OutputReader(
        plan.mode, state.config.tool_call_parser, state.config.reasoning_parser, plan.reasoning
    )


def _usage(result: Result) -> dict[str, int]:
    cached = result.usage.cached_tokens
    return usage_body(result.num_prompt_tokens - cached, result.usage.completion_tokens, cached)


async def _events(
    state: APIState,
    mid: str,
    prompt_tokens: int,
    reader: OutputReader,
    cutter: StopCutter,
    events: AsyncIterator[Event],
) -> AsyncIterator[str]:
    """message_start, (content_block_start, *_delta, content_block_stop)*, message_delta, message_stop."""
    counter = itertools.count()

    def sse(event: dict[str, Any]) -> str:
        next(counter)
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n"

    start = message_body(mid, state.card.name, [], None, None, usage_body(prompt_tokens, 0))
    yield sse({"type": "message_start", "message": start})
    yield sse({"type": "ping"})
    blocks = ContentBlocks()
    result: Result | None = None
    try:
        async for _, event in events:
            if isinstance(event, StreamDelta):
                for piece in reader.feed(cutter.feed(event.text)):
                    for out in blocks.add(piece):
                        yield sse(out)
            else:
                result = event
    except Exception as exc:
        yield sse({"type": "error", **_error(exc)})
        return
    if result is None:
        return  # the client hung up: nobody reads on
    rest = cutter.finish(result.finish_reason == "stop")
    for piece in reader.feed(rest) + reader.finish():
        for out in blocks.add(piece):
            yield sse(out)
    for out in blocks.close():
        yield sse(out)
    reason = stop_reason(result.finish_reason, blocks.calls_tools, cutter.matched)
    usage = _usage(result)
    yield sse(
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": cutter.matched},
            "usage": {"output_tokens": usage["output_tokens"]},
        }
    )
    yield sse({"type": "message_stop"})


def _error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, RequestError):
        exc = from_request_error(exc, "messages")
    if not isinstance(exc, APIError):
        exc = APIError(500, f"{type(exc).__name__}: {exc}", None, "internal")
    return anthropic_error_body(exc)
