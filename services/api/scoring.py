"""POST /v1/score (vLLM's shape) and /v1/rerank (vLLM's, Jina's and Cohere's): how well texts match.

Two ways, by how the model is served (served_kind.py):
- rerank, a cross-encoder: each (query, document) pair is one prompt in the judging template
  (rerank_template.py), and its score is P("yes") from the logits at its end;
- embed, a bi-encoder: every text is embedded once, and a pair's score is the cosine similarity.
Every prompt is a prefill-only request; they run together, and a hang-up aborts them.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from fastapi import APIRouter, Request

from pagedserve.services.api.embeddings import pooled
from pagedserve.services.api.errors import APIError
from pagedserve.services.api.pooling_schemas import MAX_INPUTS, RerankDocument, RerankRequest, ScoreRequest
from pagedserve.services.api.rerank_template import judge_prompt, judged_score
from pagedserve.services.api.sampling import Prompt
from pagedserve.services.api.state import (
    APIState,
    caller,
    now_s,
    serving_state,
)
from pagedserve.shared.protocol.pooling import PoolingParams

router = APIRouter()


def _pairs(text_1: str | list[str], text_2: str | list[str]) -> list[tuple[str, str]]:
    firsts = [text_1] if isinstance(text_1, str) else text_1
    seconds = [text_2] if isinstance(text_2, str) else text_2
    if not firsts or not seconds:
        raise APIError(
            400, "text_1 and text_2 must not be empty", "text_2" if firsts else "text_1", "invalid_value"
        )
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    if len(firsts) != len(seconds):
        raise APIError(
            400,
            f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: give one text_1, or as many as text_2",
            "text_2",
            "invalid_value",
        )
    if len(seconds) > MAX_INPUTS:
        raise APIError(
            400, f"text_2: at most {MAX_INPUTS} texts, got {len(seconds)}", "text_2", "invalid_value"
        )
    return list(zip(firsts, seconds, strict=True))


async def score_pairs(
    request: Request,
    state: APIState,
    pairs: list[tuple[str, str]],
    instruction: str | None,
    user: str | None,
    priority: int | None,
    field: str,
) -> tuple[list[float], int]:
    """Each pair's score and the prompt tokens spent (ClientGone on a hang-up)."""
    card = state.card
    kind = card.kind
    rid = f"score-{uuid.uuid4().hex}"
    if kind.runner == "rerank":
        assert kind.judge_token_ids is not None
        prompts = [
            Prompt(token_ids=judge_prompt(card.tokenizer, q, d, instruction, card.max_model_len))
            for q, d in pairs
        ]
        results = await pooled(
            request,
            state,
            prompts,
            PoolingParams(token_ids=list(kind.judge_token_ids)),
            rid,
            user,
            priority,
            field,
        )
        scores = [judged_score(*r.vector) for r in results]
        return scores, sum(r.num_prompt_tokens for r in results)
    texts = list(dict.fromkeys(t for pair in pairs for t in pair))  # each distinct text embedded once
    pooling = PoolingParams(pooling=kind.pooling, normalize=True)
    results = await pooled(
        request, state, [Prompt(text=t) for t in texts], pooling, rid, user, priority, field
    )
    vectors = {t: r.vector for t, r in zip(texts, results, strict=True)}
    scores = [_cosine(vectors[a], vectors[b]) for a, b in pairs]
    return scores, sum(r.num_prompt_tokens for r in results)


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norms if norms else 0.0


@router.post("/v1/score", response_model=None)
@router.post("/score", response_model=None, include_in_schema=False)
async def create_score(body: ScoreRequest, request: Request) -> dict[str, Any]:
    state = serving_state(request, body.model, "score", "/v1/score")
    pairs = _pairs(body.text_1, body.text_2)
    scores, tokens = await score_pairs(
        request, state, pairs, body.instruction, caller(request, body.user), body.priority, "text_2"
    )
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": now_s(),
        "model": state.card.name,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }


@router.post("/v1/rerank", response_model=None)
@router.post("/v2/rerank", response_model=None, include_in_schema=False)
@router.post("/rerank", response_model=None, include_in_schema=False)
async def create_rerank(body: RerankRequest, request: Request) -> dict[str, Any]:
    state = serving_state(request, body.model, "score", "/v1/rerank")
    documents = [d.text if isinstance(d, RerankDocument) else d for d in body.documents]
    pairs = [(body.query, d) for d in documents]
    scores, tokens = await score_pairs(
        request, state, pairs, body.instruction, caller(request, body.user), body.priority, "documents"
    )
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
    if body.top_n is not None:
        ranked = ranked[: body.top_n]
    results = []
    for i in ranked:
        entry: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if body.return_documents:
            entry["document"] = {"text": documents[i]}
        results.append(entry)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": state.card.name,
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "meta": {"billed_units": {"search_units": 1}, "tokens": {"input_tokens": tokens}},
    }
