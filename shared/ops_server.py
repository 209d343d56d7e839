"""The read-only ops HTTP endpoint each service runs in a side thread (Starlette on uvicorn).

GET routes only read (handlers take the service's lock themselves); POST routes change state and
require `Authorization: Bearer <admin_token>` — with no token configured they are refused outright.
Every server also answers `GET /process`: the process's RSS, Python object count and threads, what
a soak run watches for slow leaks.

`view` routes (the live web view, ops/view/) take the query string and, when an admin token is
configured, need it: as a bearer header, or once as `?token=` on the page, which trades it for an
HttpOnly cookie, so that a browser can open the view and its polls carry the token.

Handlers are plain functions returning `(status, content type, body)`: the services' cores know
nothing of the web stack. Starlette runs them in its worker threads (a slow `/blocks` dump never
blocks `/healthz`); uvicorn serves on a socket bound here, so a taken port fails at construction.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import json
import os
import socket
import threading
from collections.abc import Callable
from http.cookies import SimpleCookie
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from pagedserve.shared.proc_memory import resident_bytes

Handler = Callable[[], tuple[int, str, bytes]]
BodyHandler = Callable[[Any], tuple[int, str, bytes]]  # an admin POST that reads a JSON body
QueryHandler = Callable[[dict[str, str]], tuple[int, str, bytes]]

TOKEN_COOKIE = "pagedserve_admin"
_GZIP_ABOVE = 4096  # bytes: a 100,000-block pool's state string is mostly runs, and compresses well


def json_response(body: Any, status: int = 200) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body).encode()


def process_view() -> tuple[int, str, bytes]:
    """RSS from /proc (Linux), and every object the garbage collector tracks: a per-request leak
    shows in one or the other."""
    return json_response(
        {
            "pid": os.getpid(),
            "rss_bytes": resident_bytes(),
            "python_objects": len(gc.get_objects()),
            "threads": threading.active_count(),
        }
    )


def _token_cookie(token: str) -> str:
    cookie: SimpleCookie = SimpleCookie()
    cookie[TOKEN_COOKIE] = token  # quoted by SimpleCookie, whatever the token holds
    # typeshed types a Morsel's values as str; its flags (httponly) take a bool, as the docs show.
    cookie[TOKEN_COOKIE].update({"httponly": True, "samesite": "Strict", "path": "/"})  # pyright: ignore[reportArgumentType]
    return cookie[TOKEN_COOKIE].OutputString()


def _refused(message: str, status: int) -> Response:
    return JSONResponse({"error": message}, status)


class OpsServer:
    def __init__(
        self,
        host: str,
        port: int,
        get: dict[str, Handler],
        post: dict[str, Handler] | None = None,
        admin_token: str | None = None,
        view: dict[str, QueryHandler] | None = None,
        post_json: dict[str, BodyHandler] | None = None,
    ) -> None:
        self._token = admin_token
        routes = [
            Route(path, self._plain(handler), methods=["GET"])
            for path, handler in {"/process": process_view, **get}.items()
        ]
        routes += [
            Route(path, self._admin(handler), methods=["POST"]) for path, handler in (post or {}).items()
        ]
        routes += [
            Route(path, self._view(handler), methods=["GET"]) for path, handler in (view or {}).items()
        ]
        routes += [
            Route(path, self._admin_json(handler), methods=["POST"])
            for path, handler in (post_json or {}).items()
        ]
        app = Starlette(
            routes=routes,
            middleware=[Middleware(GZipMiddleware, minimum_size=_GZIP_ABOVE, compresslevel=1)],
            exception_handlers={404: self._not_found, 405: self._not_found},
        )
        self._socket = socket.create_server((host, port), reuse_port=False)
        self.port = self._socket.getsockname()[1]
        # access_log off: scrapes every few seconds would drown the structured log.
        config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._serve, name="ops-http", daemon=True)

    # ------------------------------------------------------------------ routes

    def _token_ok(self, given: str) -> bool:
        return self._token is not None and hmac.compare_digest(given.encode(), self._token.encode())

    @staticmethod
    def _bearer(request: Request) -> str:
        return request.headers.get("authorization", "").removeprefix("Bearer ").strip()

    @staticmethod
    def _plain(handler: Handler) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            status, ctype, body = await run_in_threadpool(handler)
            return Response(body, status, media_type=ctype)

        return endpoint

    def _admin(self, handler: Handler) -> Callable[[Request], Any]:
        plain = self._plain(handler)

        async def endpoint(request: Request) -> Response:
            if not self._token_ok(self._bearer(request)):
                return _refused("admin token required", 403)
            return await plain(request)

        return endpoint

    def _admin_json(self, handler: BodyHandler) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            if not self._token_ok(self._bearer(request)):
                return _refused("admin token required", 403)
            try:
                body = json.loads(await request.body() or b"{}")
            except ValueError as exc:
                return JSONResponse({"error": f"body must be JSON: {exc}"}, 400)
            status, ctype, out = await run_in_threadpool(handler, body)
            return Response(out, status, media_type=ctype)

        return endpoint

    def _view(self, handler: QueryHandler) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            query = dict(request.query_params)
            if self._token is not None:
                given = request.cookies.get(TOKEN_COOKIE) or self._bearer(request)
                if not self._token_ok(given):
                    if not self._token_ok(query.get("token", "")):
                        return _refused("admin token required (?token= or Bearer)", 403)
                    # The token leaves the address bar (and the history) at once; the cookie holds it.
                    redirect = RedirectResponse(request.url.path, status_code=303)
                    redirect.headers.append("set-cookie", _token_cookie(self._token))
                    return redirect
            status, ctype, body = await run_in_threadpool(handler, query)
            return Response(body, status, media_type=ctype)

        return endpoint

    @staticmethod
    async def _not_found(request: Request, exc: Exception) -> Response:
        return _refused(f"no route {request.url.path}", 404)

    # ------------------------------------------------------------------ life cycle

    def _serve(self) -> None:
        # A fresh event loop on this thread; uvicorn installs no signal handlers off the main thread.
        asyncio.run(self._server.serve(sockets=[self._socket]))

    def start(self) -> OpsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=5)
        self._socket.close()
