"""The app factory: routes, error handlers, middleware, and the SDK client living as long as the app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import structlog
from fastapi import Depends, FastAPI
from starlette.routing import Mount, Route, WebSocketRoute

from pagedserve.services.api import chat, completions, embeddings, routes, scoring, tokenize
from pagedserve.services.api.api_keys import load_api_keys
from pagedserve.services.api.errors import HANDLERS
from pagedserve.services.api.messages import routes as messages_routes
from pagedserve.services.api.metrics import APIMetrics, MetricsMiddleware
from pagedserve.services.api.model_card import ModelCard, load_model_card
from pagedserve.services.api.request_ids import RequestIdMiddleware
from pagedserve.services.api.responses import routes as responses_routes
from pagedserve.services.api.responses.store import ResponseStore
from pagedserve.services.api.state import APIState
from pagedserve.services.api.tool_parsers import check_parser
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.sdk import AsyncClient, load_client_keys

HEALTH_TIMEOUT_S = 2.0


def log_start_phases(app: FastAPI) -> None:
    """What this process's start spent, as seconds since it began (server.py fills the first ones)."""
    phases = getattr(app.state, "start_phases", None)
    if phases is None:
        return
    from pagedserve.services.api.server import process_age_s

    structlog.get_logger().bind(service="api").info("api_start_phases", **phases, serving_s=process_age_s())


def create_app(config: ServeConfig, card: ModelCard | None = None) -> FastAPI:
    """An app serving `config.model` through the scheduler at `config.front_endpoint`."""
    check_parser(config.tool_call_parser)  # a misspelt --tool-call-parser fails at start, not per request
    card = card or load_model_card(config)
    metrics = APIMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        keys = load_client_keys(config.curve_keys_dir) if config.curve_keys_dir else None
        client = AsyncClient(
            config.front_endpoint,
            timeout_s=config.request_timeout_s,
            heartbeat_s=config.heartbeat_interval_s,
            max_message_bytes=config.max_message_bytes,
            curve_server_public_key=None if keys is None else keys["curve_server_public_key"],
            curve_client_keys=None if keys is None else keys["curve_client_keys"],
            # Prompts tokenized and text made here: several API processes share that work, and the
            # scheduler's one thread only schedules.
            tokenizer=card.tokenizer,
        )
        async with client, httpx.AsyncClient(timeout=HEALTH_TIMEOUT_S) as http:
            log_start_phases(app)
            app.state.api = APIState(
                config, card, client, http, metrics, ResponseStore(config.responses_kept)
            )
            yield

    app = FastAPI(title="pagedserve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.model_name = card.name
    # Read here, before serving: a bad keys file stops the API at start with the file's problem.
    app.state.api_keys = load_api_keys(config.api_keys_file) if config.api_keys_file else None
    guarded = [Depends(routes.require_api_key)]
    api_routers = [
        routes.router,
        completions.router,
        chat.router,
        embeddings.router,
        scoring.router,
        tokenize.router,
        responses_routes.router,
        messages_routes.router,
    ]
    open_routers = [routes.health_router, tokenize.version_router]
    for router in api_routers:
        app.include_router(router, dependencies=guarded)
    for router in open_routers:
        app.include_router(router)
    for exc_class, handler in HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
    every = [route for router in api_routers + open_routers for route in router.routes]
    known = {route.path for route in every if isinstance(route, Route | WebSocketRoute | Mount)}
    app.add_middleware(MetricsMiddleware, metrics=metrics, routes=known)
    app.add_middleware(RequestIdMiddleware)
    return app
