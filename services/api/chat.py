"""POST /v1/chat/completions: messages rendered by the model's chat template, n completions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from pagedserve.services.api.chat_plan import ChatPlan, plan_chat
from pagedserve.services.api.choices import Reading, chat_choice, usage_body
from pagedserve.services.api.errors import as_api_errors
from pagedserve.services.api.generation import Fanout, generate_all
from pagedserve.services.api.sampling import Prompt
from pagedserve.services.api.schemas import ChatCompletionRequest
from pagedserve.services.api.state import (
    APIState,
    caller,
    check_model,
    now_s,
    response_id,
    run_unless_disconnected,
    serving_state,
    stream_response,
)
from pagedserve.services.api.streaming import StreamShape, chat_chunks
from pagedserve.services.api.structured import constraint_errors

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> dict[str, Any] | Response:
    state = serving_state(request, body.model, "generate", "/v1/chat/completions")
    plan = plan_chat(state, body)
    with constraint_errors(plan.constraint):  # the scheduler refused the constraint: name the request's field
        return await _run(request, body, state, plan)


def reading_of(state: APIState, plan: ChatPlan) -> Reading:
    return Reading(plan.mode, state.config.tool_call_parser, state.config.reasoning_parser, plan.reasoning)


async def _run(
    request: Request, body: ChatCompletionRequest, state: APIState, plan: ChatPlan
) -> dict[str, Any] | Response:
    lora = check_model(state, body.model)  # the adapter the request runs with (None: base)
    card = state.card
    sampling = plan.sampling
    reading = reading_of(state, plan)
    prompts = [Prompt(token_ids=plan.token_ids)]
    rid = response_id(request, "chatcmpl")
    created = now_s()
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        shape = StreamShape(card, rid, created, sampling.n, 1, include_usage, body.logprobs, reading=reading)
        with as_api_errors("messages"):
            fanout = await Fanout.open(state.client, prompts, sampling, rid, caller(request, body.user), lora)
        return await stream_response(request, fanout, lambda events: chat_chunks(shape, events), "messages")
    (result,) = await run_unless_disconnected(
        request,
        generate_all(state.client, prompts, sampling, rid, caller(request, body.user), lora),
        "messages",
    )
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": card.name,
        "choices": [chat_choice(card, out.index, out, body.logprobs, reading) for out in result.outputs],
        "usage": usage_body([result]),
        "system_fingerprint": None,
    }
