"""GET from a pagedserve ops endpoint (the read-only HTTP side of the scheduler and block manager),
or wait until any loopback HTTP server answers (an API's /health, a peer server's /v1/models)."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

# Proxies off: ops endpoints are on loopback or the cluster network, and an http_proxy variable
# must not send /blocks to some gateway.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """Status and body; an HTTP error status is returned, not raised. Network errors raise OSError,
    a response cut short too (a server killed while it answers: http.client.IncompleteRead)."""
    try:
        with _opener.open(url, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except http.client.HTTPException as e:
        raise OSError(f"GET {url}: {type(e).__name__}: {e}") from e


def get_json(url: str, timeout_s: float = 5.0) -> Any:
    status, body = get(url, timeout_s)
    if status != 200:
        raise OSError(f"GET {url}: HTTP {status}: {body[:200].decode(errors='replace')}")
    return json.loads(body)


def is_ok(url: str, timeout_s: float = 1.0) -> bool:
    try:
        return get(url, timeout_s)[0] == 200
    except (OSError, ValueError):
        return False


def wait_ok(
    url: str,
    timeout_s: float,
    *,
    poll_s: float = 0.2,
    check: Callable[[], None] | None = None,
    hint: str = "",
) -> None:
    """Until a GET of `url` answers 200. `check` runs before each try and raises to give up early (the
    server's process exited); TimeoutError after `timeout_s`, `hint` (where its log is) appended."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        if is_ok(url, timeout_s=5.0):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"no 200 from {url} within {timeout_s:.0f} s{hint}")
        time.sleep(poll_s)
