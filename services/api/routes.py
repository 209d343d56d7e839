"""GET /v1/models, /health and /metrics, and the API key check of every /v1 route."""

from __future__ import annotations

import hmac
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pagedserve.services.api.api_keys import key_owner
from pagedserve.services.api.errors import APIError
from pagedserve.services.api.state import api_state

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
    elif token and expected is not None and hmac.compare_digest(token.encode(), expected.encode()):
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


async def _model_entries(request: Request) -> list[dict[str, Any]]:
    """The base model, then each loaded LoRA adapter as its own model whose `parent` is the base
    (vLLM's shape); the adapters are the scheduler's (its ops /loras), which loads and unloads them."""
    state = api_state(request)
    base = _model_entry(request)
    adapters: list[dict[str, Any]] = []
    if state.config.max_loras > 0:
        listed = await _scheduler_ops(state, "GET", "/loras")
        adapters = [
            {**base, "id": a["name"], "root": a["path"], "parent": base["id"]}
            for a in listed.get("adapters", [])
        ]
    return [{**base, "parent": None}, *adapters]


async def _scheduler_ops(state: Any, method: str, route: str, body: dict[str, Any] | None = None) -> Any:
    """One call to the scheduler's ops endpoint (LoRA admin and listing); 503 when it does not answer."""
    url = scheduler_readyz_url(state.config.ops_host, state.config.scheduler_ops_port).removesuffix("/readyz")
    headers = {"authorization": f"Bearer {state.config.admin_token}"} if state.config.admin_token else {}
    try:
        reply = await state.http.request(method, url + route, json=body, headers=headers, timeout=10.0)
    except httpx.HTTPError as exc:
        raise APIError(
            503, f"the scheduler's ops endpoint did not answer: {exc}", None, "scheduler_unreachable"
        ) from None
    try:
        data = reply.json()
    except ValueError:
        data = {"error": reply.text}
    if reply.status_code >= 400:
        raise APIError(reply.status_code, str(data.get("error", data)), "lora_name", "lora_refused")
    return data


def _require_admin(request: Request) -> None:
    """LoRA load/unload change what every user is served: the admin token, never just an API key."""
    expected = api_state(request).config.admin_token
    scheme, _, token = request.headers.get("x-admin-token", "").partition(" ")
    given = (token or scheme).strip()
    if expected is None:
        raise APIError(
            403, "loading and unloading LoRA adapters needs an admin_token configured", None, "admin_only"
        )
    if not given or not hmac.compare_digest(given.encode(), expected.encode()):
        raise APIError(
            403,
            "loading and unloading LoRA adapters needs the admin token: X-Admin-Token: <token>",
            None,
            "admin_only",
        )


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request) -> dict[str, Any]:
    """vLLM's shape: {"lora_name": ..., "lora_path": ...}; refused (400 naming the file or module) when
    the adapter does not fit the base model, and nothing changes."""
    return await _lora_op(request, "load")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> dict[str, Any]:
    """{"lora_name": ...}; 409 naming the live requests that use it (they are not waited for)."""
    return await _lora_op(request, "unload")


async def _lora_op(request: Request, op: str) -> dict[str, Any]:
    """An admin's LoRA load or unload, passed to the scheduler's ops route as the client wrote it."""
    _require_admin(request)
    body = await request.json()
    return await _scheduler_ops(
        api_state(request), "POST", f"/loras/{op}", body if isinstance(body, dict) else {}
    )


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": await _model_entries(request)}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    entries = {e["id"]: e for e in await _model_entries(request)}
    if model_id not in entries:
        raise APIError(
            404,
            f"model {model_id!r} does not exist; this server serves {', '.join(entries)}",
            "model",
            "model_not_found",
        )
    return entries[model_id]


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
