"""POST /v1/completions: one or more prompts (text or token ids), each with n completions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from pagedserve.services.api.choices import completion_choice, usage_body
from pagedserve.services.api.echo import without_generated
from pagedserve.services.api.errors import as_api_errors
from pagedserve.services.api.generation import Fanout, generate_all
from pagedserve.services.api.sampling import (
    Prompt,
    asks_prompt_only,
    completion_prompts,
    completion_sampling,
)
from pagedserve.services.api.schemas import CompletionRequest
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
from pagedserve.services.api.streaming import StreamShape, completion_chunks
from pagedserve.services.api.structured import constraint_errors, request_constraint
from pagedserve.shared.protocol.frontend import SamplingParams

router = APIRouter()


@router.post("/v1/completions", response_model=None)
async def create_completion(body: CompletionRequest, request: Request) -> dict[str, Any] | Response:
    state = serving_state(request, body.model, "generate", "/v1/completions")
    constraint = request_constraint(body)
    sampling = completion_sampling(body, constraint)
    prompts = completion_prompts(body)
    with constraint_errors(constraint):  # the scheduler refused the constraint: name the request's field
        return await _run(request, body, state, sampling, prompts)


async def _run(
    request: Request,
    body: CompletionRequest,
    state: APIState,
    sampling: SamplingParams,
    prompts: list[Prompt],
) -> dict[str, Any] | Response:
    lora = check_model(state, body.model)  # the adapter the request runs with (None: base)
    rid = response_id(request, "cmpl")
    card = state.card
    echo = (
        [p.text if p.text is not None else card.decode(p.token_ids or []) for p in prompts]
        if body.echo
        else None
    )
    created = now_s()
    only_prompt = asks_prompt_only(body)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        shape = StreamShape(
            card,
            rid,
            created,
            sampling.n,
            len(prompts),
            include_usage,
            body.logprobs is not None,
            echo,
            prompt_only=only_prompt,
        )
        with as_api_errors("prompt"):
            fanout = await Fanout.open(state.client, prompts, sampling, rid, caller(request, body.user), lora)
        return await stream_response(
            request, fanout, lambda events: completion_chunks(shape, events), "prompt"
        )
    results = await run_unless_disconnected(
        request,
        generate_all(state.client, prompts, sampling, rid, caller(request, body.user), lora),
        "prompt",
    )
    choices = [
        completion_choice(
            card,
            i * sampling.n + out.index,
            without_generated(out) if only_prompt else out,
            echo[i] if echo else None,
            body.logprobs is not None,
            result.prompt_logprobs,
        )
        for i, result in enumerate(results)
        for out in result.outputs
    ]
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": card.name,
        "choices": choices,
        "usage": usage_body(results, only_prompt),
        "system_fingerprint": None,
    }
