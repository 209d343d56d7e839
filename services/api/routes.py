"""GET /v1/models, /health and /metrics, and the API key check of every /v1 route."""

from __future__ import annotations

import hmac
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pagedserve.services.api.api_keys import key_owner
from pagedserve.services.api.errors import APIError
from pagedserve.services.api.state import api_state
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter()


def require_api_key(request: Request) -> None:
    """With an api_key or named keys configured, /v1 wants `Authorization: Bearer <key>` or `x-api-key` (401
    otherwise); a named key's name becomes the request's user (request.state.key_name)."""
    named, expected = request.app.state.api_keys, api_state(request).config.api_key
    if named is None and expected is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    token = token or request.headers.get("x-api-key", "").strip()  # Anthropic's clients send their key here
    if named is not None:
        request.state.key_name = key_owner(named, token) if token else None
        if request.state.key_name is not None:
            return
    elif token and hmac.compare_digest(token.encode(), expected.encode()):
        return
    raise APIError(401, "a valid API key is required: Authorization: Bearer <key>", None, "invalid_api_key")


def _model_entry(request: Request) -> dict[str, Any]:
    card = api_state(request).card
    return {
        "id": card.name,
        "object": "model",
        "created": card.created,
        "owned_by": "pagedserve",
        "root": str(card.path),
        "max_model_len": card.max_model_len,
    }


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_entry(request)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    entry = _model_entry(request)
    if model_id != entry["id"]:
        raise APIError(
            404,
            f"model {model_id!r} does not exist; this server serves {entry['id']!r}",
            "model",
            "model_not_found",
        )
    return entry


health_router = APIRouter()


@health_router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 only when the scheduler answers and has a ready worker (its own /readyz says so)."""
    state = api_state(request)
    url = scheduler_readyz_url(state.config.ops_host, state.config.scheduler_ops_port)
    try:
        reply = await state.http.get(url)
        ready = reply.json()
    except (httpx.HTTPError, ValueError) as exc:
        return JSONResponse(
            {"status": "unavailable", "reason": f"scheduler unreachable at {url}: {exc}"}, 503
        )
    if reply.status_code != 200 or not ready.get("ready"):
        return JSONResponse(
            {"status": "unavailable", "reason": "no worker is ready", "scheduler": ready}, 503
        )
    return JSONResponse({"status": "ok", "workers": ready.get("workers", [])})


@health_router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(api_state(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


def scheduler_readyz_url(ops_host: str, port: int) -> str:
    host = "127.0.0.1" if ops_host in ("0.0.0.0", "") else ops_host  # a wildcard bind is reached on loopback
    return f"http://{host}:{port}/readyz"
