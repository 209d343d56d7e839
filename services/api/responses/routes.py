"""POST /v1/responses (streamed or not), GET and DELETE /v1/responses/{id}, POST .../{id}/cancel.

A response is a chat request (items.py -> chat_plan.py): the conversation is the stored history of
`previous_response_id` followed by this request's input, `instructions` first (never carried over,
as OpenAI does). Its output is read by the same reader as chat (reasoning, text, function calls) and
built into output items (body.py); streamed, every change is also an event (stream.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from pagedserve.services.api.chat_plan import ChatPlan, plan_chat
from pagedserve.services.api.errors import APIError, as_api_errors
from pagedserve.services.api.generation import Fanout, generate_all
from pagedserve.services.api.output_reader import OutputReader
from pagedserve.services.api.responses.body import OutputItems, new_id, response_body, usage_body
from pagedserve.services.api.responses.items import (
    chat_messages,
    chat_tool_choice,
    chat_tools,
    normalize_items,
    output_as_items,
)
from pagedserve.services.api.responses.schemas import ResponsesRequest
from pagedserve.services.api.responses.store import ResponseStore, StoredResponse
from pagedserve.services.api.responses.stream import response_events
from pagedserve.services.api.sampling import Prompt
from pagedserve.services.api.schemas import ChatCompletionRequest
from pagedserve.services.api.state import (
    APIState,
    api_state,
    caller,
    now_s,
    run_unless_disconnected,
    serving_state,
    stream_response,
)
from pagedserve.services.api.structured import constraint_errors
from pagedserve.shared.sdk import Result

router = APIRouter()
T = TypeVar("T")

# Our chat request's field names -> the Responses request's, for the errors a client reads.
_RENAMED = (
    ("max_completion_tokens", "max_output_tokens"),
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format", "text.format"),
    ("messages", "input"),
)


def _renamed(exc: APIError) -> APIError:
    param, message = exc.param, exc.message
    for ours, theirs in _RENAMED:
        if param is not None and param.startswith(ours):
            param = theirs + param[len(ours) :]
        message = message.replace(ours, theirs)
    if param is not None and param.startswith("tools[") and ".function." in param:
        param = param.replace(".function.", ".", 1)
    return APIError(exc.status, message, param, exc.code)


def store_of(state: APIState) -> ResponseStore:
    return state.responses


def chat_request(body: ResponsesRequest, items: list[dict[str, Any]]) -> ChatCompletionRequest:
    fmt = body.text.format if body.text else None
    response_format = None
    if fmt is not None and fmt.type == "json_object":
        response_format = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        schema = {"name": fmt.name or "response", "schema": fmt.schema_ or {}, "strict": fmt.strict}
        response_format = {"type": "json_schema", "json_schema": schema}
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": chat_messages(items, body.instructions),
        "tools": chat_tools(body.tools),
        "tool_choice": chat_tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": response_format,
        "max_completion_tokens": body.max_output_tokens,
        "chat_template_kwargs": body.chat_template_kwargs,
    }
    passed = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "priority", "user")
    for name in (*passed, "speculate", "num_speculative_tokens"):
        fields[name] = getattr(body, name)
    try:
        return ChatCompletionRequest(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise APIError(400, str(exc.errors()[0].get("msg")), "input", "invalid_value") from None


def _refuse_unserved(body: ResponsesRequest) -> None:
    for name in ("background", "conversation", "prompt"):
        if getattr(body, name):
            raise APIError(400, f"{name} is not supported here", name, "unsupported")


@router.post("/v1/responses", response_model=None)
async def create_response(body: ResponsesRequest, request: Request) -> dict[str, Any] | Response:
    state = serving_state(request, body.model, "generate", "/v1/responses")
    _refuse_unserved(body)
    store = store_of(state)
    items = normalize_items(body.input)
    history = store.history(body.previous_response_id) if body.previous_response_id else []
    try:
        plan = plan_chat(state, chat_request(body, history + items))
    except APIError as exc:
        raise _renamed(exc) from None
    rid = new_id("resp")
    created = now_s()
    started = response_body(body, rid, created, state.card.name, "in_progress", [], None)
    cancelled = store.start(rid, started)
    try:
        with constraint_errors(plan.constraint):
            try:
                if body.stream:
                    return await _stream(request, state, body, plan, rid, started, items, cancelled)
                return await _whole(request, state, body, plan, rid, created, items, cancelled)
            except APIError as exc:
                raise _renamed(exc) from None
    finally:
        if not body.stream:
            store.end(rid)


def reader_of(state: APIState, plan: ChatPlan) -> OutputReader:
    return OutputReader(
        plan.mode, state.config.tool_call_parser, state.config.reasoning_parser, plan.reasoning
    )


def finish_response(
    state: APIState,
    body: ResponsesRequest,
    rid: str,
    created: int,
    items: list[dict[str, Any]],
    output: OutputItems,
    result: Result | None,
    status: str,
) -> dict[str, Any]:
    """The final body (and its place in the store): `status` completed, incomplete, cancelled, failed."""
    output.end("incomplete" if status == "incomplete" else "completed")  # streamed: ended already
    usage = None
    if result is not None:
        usage = usage_body(
            result.num_prompt_tokens, result.usage.completion_tokens, result.usage.cached_tokens
        )
    final = response_body(body, rid, created, state.card.name, status, output.items, usage)
    if body.store and status in ("completed", "incomplete"):
        turn = items + output_as_items(output.items)
        store_of(state).put(rid, StoredResponse(final, turn, body.previous_response_id))
    return final


def status_of(result: Result) -> str:
    return "incomplete" if result.finish_reason == "length" else "completed"


async def _until_cancelled(work: Awaitable[T], cancelled: asyncio.Event) -> T | None:
    """`await work`, or None once `cancelled` is set (the work is cancelled, aborting its requests)."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(cancelled.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    return task.result() if not task.cancelled() else None


async def _whole(
    request: Request,
    state: APIState,
    body: ResponsesRequest,
    plan: ChatPlan,
    rid: str,
    created: int,
    items: list[dict[str, Any]],
    cancelled: asyncio.Event,
) -> dict[str, Any]:
    work = generate_all(
        state.client, [Prompt(token_ids=plan.token_ids)], plan.sampling, rid, caller(request, body.user)
    )
    results = await run_unless_disconnected(request, _until_cancelled(work, cancelled), "input")
    output = OutputItems()
    if results is None:
        return finish_response(state, body, rid, created, items, output, None, "cancelled")
    (result,) = results
    reader = reader_of(state, plan)
    for piece in reader.feed(result.text) + reader.finish():
        output.add(piece)
    return finish_response(state, body, rid, created, items, output, result, status_of(result))


async def _stream(
    request: Request,
    state: APIState,
    body: ResponsesRequest,
    plan: ChatPlan,
    rid: str,
    started: dict[str, Any],
    items: list[dict[str, Any]],
    cancelled: asyncio.Event,
) -> Response:
    store = store_of(state)
    try:
        with as_api_errors("input"):
            fanout = await Fanout.open(
                state.client,
                [Prompt(token_ids=plan.token_ids)],
                plan.sampling,
                rid,
                caller(request, body.user),
            )
    except BaseException:
        store.end(rid)
        raise

    def finish(output: OutputItems, result: Result | None, status: str) -> dict[str, Any]:
        store.end(rid)
        return finish_response(state, body, rid, started["created_at"], items, output, result, status)

    def render(events: Any) -> Any:
        return response_events(
            started, reader_of(state, plan), events, cancelled, fanout.close, finish, status_of
        )

    try:
        return await stream_response(request, fanout, render, "input")
    except BaseException:
        store.end(rid)
        raise


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    return store_of(api_state(request)).get(response_id).body


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    store_of(api_state(request)).delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request) -> dict[str, Any]:
    """A running response stops (its requests are aborted) and ends with status cancelled."""
    store = store_of(api_state(request))
    snapshot = store.cancel(response_id)
    if snapshot is None:
        kept = store.get(response_id)
        raise APIError(
            400,
            f"response {response_id!r} is not running (its status is {kept.body['status']!r}): only a running "
            f"response can be cancelled",
            "response_id",
            "invalid_value",
        )
    return {**snapshot, "status": "cancelled"}
