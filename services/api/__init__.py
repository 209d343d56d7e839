"""The OpenAI-compatible HTTP API: `/v1/completions`, `/v1/chat/completions`, `/v1/models`.

One more client of the scheduler's front socket (through the SDK's AsyncClient): it keeps no request
state that outlives a request, so several can run side by side and a scheduler restart is a reconnect.

    python -m pagedserve.services.api --model smollm2-135m --api-port 8000
"""

from pagedserve.services.api.app import create_app

__all__ = ["create_app"]
