"""POST /v1/embeddings: each input's pooled final hidden states (a prefill-only request each).

Text is tokenized by the scheduler with the tokenizer's special tokens, as sentence-transformers
does (Qwen3-Embedding's appends its end-of-text token); token arrays go as they are. `dimensions`
keeps the leading values and normalises after the cut (Matryoshka models). `encoding_format=base64`
is the float32 little-endian bytes the worker sent, as OpenAI encodes them.
"""

from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, Request

from pagedserve.services.api.errors import APIError
from pagedserve.services.api.generation import generate_all
from pagedserve.services.api.pooling_schemas import MAX_INPUTS, EmbeddingRequest
from pagedserve.services.api.sampling import Prompt
from pagedserve.services.api.state import (
    APIState,
    caller,
    response_id,
    run_unless_disconnected,
    serving_state,
)
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.pooling import PoolingParams, unpack_floats
from pagedserve.shared.sdk import Result

router = APIRouter()


def embedding_prompts(given: Any, field: str = "input") -> list[Prompt]:
    """A string, a list of strings, a token array or a list of them: one Prompt each."""
    if isinstance(given, str):
        prompts = [Prompt(text=given)]
    elif given and all(isinstance(x, int) for x in given):
        prompts = [Prompt(token_ids=list(given))]
    else:
        prompts = [Prompt(text=x) if isinstance(x, str) else Prompt(token_ids=list(x)) for x in given]
    if not prompts:
        raise APIError(400, f"{field}: must not be empty", field, "invalid_value")
    if len(prompts) > MAX_INPUTS:
        raise APIError(
            400, f"{field}: at most {MAX_INPUTS} inputs, got {len(prompts)}", field, "invalid_value"
        )
    for i, one in enumerate(prompts):
        if not (one.text or one.token_ids):
            raise APIError(400, f"{field}[{i}]: must not be empty", field, "invalid_value")
    return prompts


async def pooled(
    request: Request,
    state: APIState,
    prompts: list[Prompt],
    pooling: PoolingParams,
    rid: str,
    user: str | None,
    priority: int | None,
    field: str,
) -> list[Result]:
    """One prefill-only request per prompt, run together; a hang-up aborts them (ClientGone)."""
    sampling = SamplingParams(max_tokens=1, pooling=pooling, priority=priority or 0)
    work = generate_all(state.client, prompts, sampling, rid, user)
    return await run_unless_disconnected(request, work, field)


@router.post("/v1/embeddings", response_model=None)
async def create_embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
    state = serving_state(request, body.model, "embed", "/v1/embeddings")
    kind = state.card.kind
    prompts = embedding_prompts(body.input)
    if body.dimensions is not None and state.card.hidden_size and body.dimensions > state.card.hidden_size:
        raise APIError(
            400,
            f"dimensions: at most the model's {state.card.hidden_size}, got {body.dimensions}",
            "dimensions",
            "invalid_value",
        )
    normalize = kind.normalize if body.normalize is None else body.normalize
    pooling = PoolingParams(pooling=kind.pooling, normalize=normalize, dimensions=body.dimensions)
    results = await pooled(
        request,
        state,
        prompts,
        pooling,
        response_id(request, "embd"),
        caller(request, body.user),
        body.priority,
        "input",
    )
    data = []
    for i, result in enumerate(results):
        assert result.pooled is not None
        if body.encoding_format == "base64":
            vector: Any = base64.b64encode(result.pooled).decode()
        else:
            vector = unpack_floats(result.pooled)
        data.append({"object": "embedding", "index": i, "embedding": vector})
    tokens = sum(r.num_prompt_tokens for r in results)
    return {
        "object": "list",
        "data": data,
        "model": state.card.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
