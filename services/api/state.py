"""What every route needs: the app's long-lived objects, and the steps all generation routes share."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from pagedserve.services.api.disconnect import on_disconnect, unless_disconnected
from pagedserve.services.api.errors import APIError, as_api_errors
from pagedserve.services.api.generation import Event, Fanout
from pagedserve.services.api.metrics import APIMetrics
from pagedserve.services.api.model_card import ModelCard
from pagedserve.services.api.responses.store import ResponseStore
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.sdk import AsyncClient

MAX_REQUEST_ID_CHARS = 64


@dataclass(slots=True)
class APIState:
    config: ServeConfig
    card: ModelCard
    client: AsyncClient
    http: httpx.AsyncClient  # for the scheduler's /readyz
    metrics: APIMetrics
    responses: ResponseStore  # the Responses API's kept responses (previous_response_id) and running ones


def api_state(request: Request) -> APIState:
    return request.app.state.api


def caller(request: Request, user_field: str | None) -> str | None:
    """Who the request counts against: the name of its API key when keys are named (api_keys.py),
    else the OpenAI `user` field (or nobody: the API's own SDK identity)."""
    key_name = getattr(request.state, "key_name", None)
    return key_name if key_name is not None else (user_field or None)


def check_model(state: APIState, model: str) -> str | None:
    """The request's `model` -> the LoRA adapter it names (None: the base model). With LoRA on, any
    other name goes to the scheduler as an adapter name; it knows which are loaded (unknown_lora: 404)."""
    if model == state.card.name:
        return None
    if state.config.max_loras > 0:
        return model
    raise APIError(
        404,
        f"model {model!r} does not exist; this server serves {state.card.name!r}",
        "model",
        "model_not_found",
    )


def serving_state(request: Request, model: str, runner: str, path: str) -> APIState:
    """The app's state, once the request's `model` is one we serve (check_model) and the model is
    served as `runner`, which `path` needs (a 400 naming the flag otherwise)."""
    state = api_state(request)
    check_model(state, model)
    state.card.kind.require(runner, path, state.card.name)
    return state


def response_id(request: Request, prefix: str) -> str:
    """`<prefix>-<X-Request-Id>` when the client sent one (echoed by the request-id middleware)."""
    given = request.headers.get("x-request-id")
    if given is None:
        return f"{prefix}-{uuid.uuid4().hex}"
    if not 0 < len(given) <= MAX_REQUEST_ID_CHARS or not given.isprintable():
        raise APIError(
            400,
            f"X-Request-Id must be 1 to {MAX_REQUEST_ID_CHARS} printable characters, got {len(given)}",
            "X-Request-Id",
            "invalid_value",
        )
    return f"{prefix}-{given}"


def now_s() -> int:
    return int(time.time())


async def run_unless_disconnected(request: Request, work: Any, prompt_field: str) -> Any:
    """A non-streamed request's work; a hang-up cancels it (aborting its requests) and raises
    ClientGone, which the app answers 499."""
    with as_api_errors(prompt_field):
        return await unless_disconnected(request, work)


async def stream_response(
    request: Request,
    fanout: Fanout,
    render: Callable[[AsyncIterator[Event]], AsyncIterator[str]],
    prompt_field: str,
) -> Response:
    """Wait for the first event before sending headers, so that a refusal (a prompt too long, no
    workers, a full queue) still gets its status; then stream, aborting on a hang-up."""
    events = fanout.events()
    try:
        with as_api_errors(prompt_field):
            first = await unless_disconnected(request, anext(events))
    except BaseException:  # a refusal, or a hang-up (ClientGone: the app answers 499)
        await fanout.close()
        raise

    async def replay() -> AsyncIterator[Event]:
        yield first
        async for event in events:
            yield event

    async def body() -> AsyncIterator[str]:
        # Starlette stops a stream only when a write fails; a request still queued writes nothing,
        # so the hang-up is watched on the receive channel too.
        watcher = on_disconnect(request, fanout.close)
        try:
            async for chunk in render(replay()):
                yield chunk
        finally:
            watcher.cancel()
            await fanout.close()

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
