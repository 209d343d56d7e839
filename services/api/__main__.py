"""`python -m pagedserve.services.api`: the OpenAI-compatible API on uvicorn.

    python -m pagedserve.services.api --model smollm2-135m --front-endpoint tcp://127.0.0.1:5555 \
        --api-host 127.0.0.1 --api-port 8000 [--api-key KEY] [--served-model-name NAME]

Every ServeConfig field is a flag (and a PAGEDSERVE_* variable); the API reads the model (for its
tokenizer and name), the front endpoint, the scheduler's ops port (for /health) and the api_* ones.
"""

from __future__ import annotations

import argparse

import uvicorn
from pagedserve.services.api.app import create_app
from pagedserve.shared.config import add_config_args, config_from_args
from pagedserve.shared.log import configure_logging


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="pagedserve api", description="the OpenAI-compatible HTTP API")
    add_config_args(parser)
    config = config_from_args(parser.parse_args(argv))
    log = configure_logging("api", config.log_format, config.log_level)
    app = create_app(config)
    log.info("api_starting", base_url=f"http://{config.api_host}:{config.api_port}/v1", model=config.model)
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


if __name__ == "__main__":
    main()
