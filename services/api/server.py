"""Run the API on uvicorn until SIGTERM/SIGINT: `pagedserve api` and `python -m pagedserve.services.api`."""

from __future__ import annotations

import uvicorn
from pagedserve.services.api.app import create_app
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.log import configure_logging


def base_url(config: ServeConfig) -> str:
    host = "127.0.0.1" if config.api_host in ("0.0.0.0", "", "::") else config.api_host
    return f"http://{host}:{config.api_port}/v1"


def run(config: ServeConfig) -> None:
    log = configure_logging("api", config.log_format, config.log_level)
    app = create_app(config)
    log.info("api_starting", base_url=base_url(config), model=config.model, served_as=app.state.model_name)
    # uvicorn handles SIGTERM/SIGINT itself: it stops accepting, finishes (or times out) open
    # requests, then runs the lifespan's exit, which closes the SDK client (aborting what is live).
    uvicorn.run(
        app,
        host=config.api_host,
        port=config.api_port,
        log_level="warning" if config.log_level == "info" else config.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
