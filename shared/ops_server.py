"""The read-only ops HTTP endpoint each service runs in a side thread.

GET routes only read (handlers take the service's lock themselves); POST routes change state and
require `Authorization: Bearer <admin_token>` — with no token configured they are refused outright.
Every server also answers `GET /process`: the process's RSS, Python object count and threads, what
a soak run watches for slow leaks.

`view` routes (the live web view, ops/view/) take the query string and, when an admin token is
configured, need it: as a bearer header, or once as `?token=` on the page, which trades it for an
HttpOnly cookie, so that a browser can open the view and its polls carry the token.
"""

from __future__ import annotations

import gc
import gzip
import hmac
import json
import os
import threading
from collections.abc import Callable
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

Handler = Callable[[], tuple[int, str, bytes]]
QueryHandler = Callable[[dict[str, str]], tuple[int, str, bytes]]

TOKEN_COOKIE = "pagedserve_admin"
_GZIP_ABOVE = 4096  # bytes: a 100,000-block pool's state string is mostly runs, and compresses well


def json_response(body: Any, status: int = 200) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body).encode()


def process_view() -> tuple[int, str, bytes]:
    """RSS from /proc (Linux), and every object the garbage collector tracks: a per-request leak
    shows in one or the other."""
    rss = None
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return json_response(
        {
            "pid": os.getpid(),
            "rss_bytes": rss,
            "python_objects": len(gc.get_objects()),
            "threads": threading.active_count(),
        }
    )


def _token_cookie(token: str) -> str:
    cookie: SimpleCookie = SimpleCookie()
    cookie[TOKEN_COOKIE] = token  # quoted by SimpleCookie, whatever the token holds
    cookie[TOKEN_COOKIE].update({"httponly": True, "samesite": "Strict", "path": "/"})
    return cookie[TOKEN_COOKIE].OutputString()


class OpsServer:
    def __init__(
        self,
        host: str,
        port: int,
        get: dict[str, Handler],
        post: dict[str, Handler] | None = None,
        admin_token: str | None = None,
        view: dict[str, QueryHandler] | None = None,
    ) -> None:
        routes_get, routes_post, token = {"/process": process_view, **get}, post or {}, admin_token
        routes_view = view or {}

        def token_ok(given: str) -> bool:
            return token is not None and hmac.compare_digest(given.encode(), token.encode())

        class _Handler(BaseHTTPRequestHandler):
            def _reply(
                self, status: int, ctype: str, body: bytes, headers: dict[str, str] | None = None
            ) -> None:
                zipped = len(body) > _GZIP_ABOVE and "gzip" in self.headers.get("Accept-Encoding", "")
                if zipped:
                    body = gzip.compress(body, compresslevel=1)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                if zipped:
                    self.send_header("Content-Encoding", "gzip")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def _bearer(self) -> str:
                return self.headers.get("Authorization", "").removeprefix("Bearer ").strip()

            def _view(self, route: QueryHandler, path: str, query: dict[str, str]) -> None:
                if token is None:
                    self._reply(*route(query))
                    return
                cookie = SimpleCookie(self.headers.get("Cookie", ""))
                given = cookie[TOKEN_COOKIE].value if TOKEN_COOKIE in cookie else self._bearer()
                if token_ok(given):
                    self._reply(*route(query))
                elif token_ok(query.get("token", "")):
                    # The token leaves the address bar (and the history) at once; the cookie holds it.
                    self._reply(
                        303,
                        "text/plain",
                        b"",
                        {"Location": path, "Set-Cookie": _token_cookie(token)},
                    )
                else:
                    self._reply(*json_response({"error": "admin token required (?token= or Bearer)"}, 403))

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                url = urlsplit(self.path)
                if url.path in routes_view:
                    self._view(routes_view[url.path], url.path, dict(parse_qsl(url.query)))
                    return
                route = routes_get.get(url.path)
                if route is None:
                    self._reply(*json_response({"error": f"no route {self.path}"}, 404))
                    return
                self._reply(*route())

            def do_POST(self) -> None:  # noqa: N802
                route = routes_post.get(self.path.split("?")[0])
                if route is None:
                    self._reply(*json_response({"error": f"no route {self.path}"}, 404))
                    return
                if not token_ok(self._bearer()):
                    self._reply(*json_response({"error": "admin token required"}, 403))
                    return
                self._reply(*route())

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # scrapes every few seconds would drown the structured log

        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="ops-http", daemon=True)

    def start(self) -> OpsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
