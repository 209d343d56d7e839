"""The read-only ops HTTP endpoint each service runs in a side thread.

GET routes only read (handlers take the service's lock themselves); POST routes change state and
require `Authorization: Bearer <admin_token>` — with no token configured they are refused outright.
Every server also answers `GET /process`: the process's RSS, Python object count and threads, what
a soak run watches for slow leaks.
"""

from __future__ import annotations

import gc
import hmac
import json
import os
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Handler = Callable[[], tuple[int, str, bytes]]


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


class OpsServer:
    def __init__(
        self,
        host: str,
        port: int,
        get: dict[str, Handler],
        post: dict[str, Handler] | None = None,
        admin_token: str | None = None,
    ) -> None:
        routes_get, routes_post, token = {"/process": process_view, **get}, post or {}, admin_token

        class _Handler(BaseHTTPRequestHandler):
            def _reply(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                route = routes_get.get(self.path.split("?")[0])
                if route is None:
                    self._reply(*json_response({"error": f"no route {self.path}"}, 404))
                    return
                self._reply(*route())

            def do_POST(self) -> None:  # noqa: N802
                route = routes_post.get(self.path.split("?")[0])
                if route is None:
                    self._reply(*json_response({"error": f"no route {self.path}"}, 404))
                    return
                given = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
                if token is None or not hmac.compare_digest(given.encode(), token.encode()):
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
