"""`python -m pagedserve.services.api`: the OpenAI-compatible API on uvicorn.

    python -m pagedserve.services.api --model smollm2-135m --front-endpoint tcp://127.0.0.1:5555 \
        --api-host 127.0.0.1 --api-port 8000 [--api-key KEY] [--served-model-name NAME]

The flags are the fields of the sections the API runs (shared/config.py's COMMAND_SECTIONS["api"]);
every field is also a PAGEDSERVE_* variable. The API reads the model (for its tokenizer and name), the
front endpoint, the scheduler's ops port (for /health) and the api_* ones.
"""

from __future__ import annotations

import argparse

from pagedserve.services.api.server import run
from pagedserve.shared.config import add_config_args, command_fields, config_from_args


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="pagedserve api", description="the OpenAI-compatible HTTP API")
    add_config_args(parser, command_fields("api"))
    run(config_from_args(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
