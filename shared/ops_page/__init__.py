"""The live web view: one page (view.html, HTML and an inline script, nothing fetched from
outside the machine) that either ops server serves at `/view`.

The block manager serves the pool (`/view/pool`, `/view/block`, `/view/request`); the scheduler
serves requests and workers (`/view/sched`) and passes the pool routes through to the block
manager, so its `/view` shows everything. The page asks for what its server has and polls once
a second; the server side of a poll is bounded (the pool's encoding is shared by every viewer for
VIEW_MAX_AGE_S).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from importlib import resources
from urllib.parse import urlencode

from prometheus_client import Counter

from pagedserve.shared.ops_server import QueryHandler

VIEW_MAX_AGE_S = 0.9  # the page polls once a second: one encoding per poll, however many pages
POOL_ROUTES = ("/view/pool", "/view/block", "/view/request")
_ROLES = {"block-manager": ["pool"], "scheduler": ["pool", "sched"]}
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an http_proxy


def render(role: str) -> tuple[int, str, bytes]:
    """The page, told which of the data routes its server answers."""
    page = resources.files(__name__).joinpath("view.html").read_text()  # __name__: this package's own
    config = json.dumps({"role": role, "sources": _ROLES[role]})
    return 200, "text/html; charset=utf-8", page.replace("/*CONFIG*/{}", config).encode()


def forwarder(base_url: str, route: str, token: str | None) -> QueryHandler:
    """A route that answers with the same route of another ops server (the block manager's)."""

    def forward(query: dict[str, str]) -> tuple[int, str, bytes]:
        query = {k: v for k, v in query.items() if k != "token"}
        url = base_url + route + (f"?{urlencode(query)}" if query else "")
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with _opener.open(request, timeout=3.0) as response:
                return (
                    response.status,
                    response.headers.get("Content-Type", "application/json"),
                    response.read(),
                )
        except urllib.error.HTTPError as e:
            return e.code, "application/json", e.read()
        except OSError as e:
            body = {"error": f"block manager unreachable at {base_url}: {e}"}
            return 502, "application/json", json.dumps(body).encode()

    return forward


def counter_total(counter: Counter) -> float:
    """A counter's value summed over its labels (prometheus_client's public collect())."""
    return sum(s.value for metric in counter.collect() for s in metric.samples if s.name.endswith("_total"))


def decode_states(encoded: str) -> bytes:
    """The byte per block of a `/view/pool` pool (for tests and `pagedserve top`)."""
    return base64.b64decode(encoded)


__all__ = [
    "POOL_ROUTES",
    "VIEW_MAX_AGE_S",
    "counter_total",
    "decode_states",
    "forwarder",
    "render",
]
