"""The ops HTTP server's contract, over real HTTP on loopback: routes, admin auth, the view's token
cookie, gzip for large bodies and /process. Every service's ops endpoint is this server."""

from __future__ import annotations

import gzip
import http.client
import json
from collections.abc import Iterator

import pytest

from pagedserve.shared.ops_server import TOKEN_COOKIE, OpsServer, json_response

TOKEN = "ops-test-token"
BIG = {"cells": "x" * 10_000}


def _request(
    port: int, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def server() -> Iterator[OpsServer]:
    calls: list[str] = []
    ops = OpsServer(
        "127.0.0.1",
        0,
        {"/healthz": lambda: json_response({"ok": True}), "/big": lambda: json_response(BIG)},
        {"/admin/reap": lambda: calls.append("reap") or json_response({"reclaimed": 3})},
        admin_token=TOKEN,
        view={"/view": lambda query: (200, "text/html", f"view {sorted(query.items())}".encode())},
    ).start()
    yield ops
    ops.stop()


def test_get_route_answers_json(server: OpsServer) -> None:
    status, headers, body = _request(server.port, "GET", "/healthz")
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert json.loads(body) == {"ok": True}


def test_unknown_route_is_404_naming_the_path(server: OpsServer) -> None:
    status, _, body = _request(server.port, "GET", "/nope")
    assert status == 404 and "/nope" in json.loads(body)["error"]
    status, _, _ = _request(server.port, "POST", "/nope", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 404


def test_post_needs_the_admin_token(server: OpsServer) -> None:
    assert _request(server.port, "POST", "/admin/reap")[0] == 403
    assert _request(server.port, "POST", "/admin/reap", {"Authorization": "Bearer wrong"})[0] == 403
    status, _, body = _request(server.port, "POST", "/admin/reap", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and json.loads(body) == {"reclaimed": 3}


def test_post_is_refused_when_no_token_is_configured() -> None:
    ops = OpsServer("127.0.0.1", 0, {}, {"/admin/reap": lambda: json_response({})}).start()
    try:
        assert _request(ops.port, "POST", "/admin/reap", {"Authorization": "Bearer "})[0] == 403
    finally:
        ops.stop()


def test_view_trades_the_query_token_for_an_http_only_cookie(server: OpsServer) -> None:
    assert _request(server.port, "GET", "/view")[0] == 403
    status, headers, _ = _request(server.port, "GET", f"/view?token={TOKEN}&lane=2")
    assert status == 303 and headers["location"] == "/view"
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"{TOKEN_COOKIE}=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    status, _, body = _request(server.port, "GET", "/view?lane=2", {"Cookie": cookie.split(";")[0]})
    assert status == 200 and body == b"view [('lane', '2')]"
    status, _, _ = _request(server.port, "GET", "/view", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200


def test_view_is_open_without_a_configured_token() -> None:
    ops = OpsServer("127.0.0.1", 0, {}, view={"/view": lambda q: (200, "text/plain", b"open")}).start()
    try:
        assert _request(ops.port, "GET", "/view")[2] == b"open"
    finally:
        ops.stop()


def test_large_bodies_are_gzipped_only_when_the_client_accepts_it(server: OpsServer) -> None:
    status, headers, body = _request(server.port, "GET", "/big", {"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("content-encoding") == "gzip"
    assert json.loads(gzip.decompress(body)) == BIG
    status, headers, body = _request(server.port, "GET", "/big")
    assert "content-encoding" not in headers and json.loads(body) == BIG
    _, headers, _ = _request(server.port, "GET", "/healthz", {"Accept-Encoding": "gzip"})
    assert "content-encoding" not in headers  # small bodies are not worth compressing


def test_process_reports_rss_objects_and_threads(server: OpsServer) -> None:
    status, _, body = _request(server.port, "GET", "/process")
    view = json.loads(body)
    assert status == 200 and view["rss_bytes"] > 0 and view["python_objects"] > 0 and view["threads"] >= 1
