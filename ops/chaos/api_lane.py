"""One chaos request through the OpenAI-compatible HTTP API, as a client of that API would send it.

A streamed `/v1/completions` request: its text deltas are concatenated and later compared with the
fault-free reference. A killed API server takes its open HTTP connections with it (no HTTP server
can hand a half-sent response to its successor), so when the connection breaks the request is
counted as interrupted and sent again, as an OpenAI client's retry would; the retry must give the
exact reference text. Everything else the services do (a scheduler or block manager restarted, a
worker lost) must stay invisible behind the API: the stream simply goes on.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

# Time to wait before re-sending after the API server's death: it is restarted with backoff.
RETRY_PAUSE_S = 0.5


async def served_model(http: httpx.AsyncClient, base_url: str, until: float) -> str:
    """The model id the API serves (GET /models), waiting while the API server (re)starts."""
    while True:
        try:
            resp = await http.get(f"{base_url}/models")
            if resp.status_code == 200:
                return str(resp.json()["data"][0]["id"])
        except httpx.TransportError:
            pass
        if time.monotonic() >= until:
            raise TimeoutError(f"{base_url}/models did not answer")
        await asyncio.sleep(RETRY_PAUSE_S)


async def stream_completion(
    http: httpx.AsyncClient, base_url: str, body: dict[str, Any], on_text: Any
) -> tuple[str | None, str | None]:
    """One streamed completion: (finish_reason, None) when it ended, (None, error code) when the
    API answered with an error. A broken connection raises httpx.TransportError."""
    finish: str | None = None
    async with http.stream("POST", f"{base_url}/completions", json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return None, _error_code(resp)
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                return None, str(chunk["error"].get("code") or chunk["error"].get("type") or "error")
            for choice in chunk.get("choices", []):
                on_text(choice.get("text", ""))
                finish = choice.get("finish_reason") or finish
    if finish is None:
        # The server closed the stream without [DONE] or a finish reason: it died mid-response.
        raise httpx.RemoteProtocolError("stream ended without a finish reason")
    return finish, None


def _error_code(resp: httpx.Response) -> str:
    try:
        error = resp.json().get("error", {})
        return str(error.get("code") or error.get("type") or resp.status_code)
    except ValueError:
        return str(resp.status_code)
