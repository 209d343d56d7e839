"""A client that hangs up, streaming or not, aborts its request: the scheduler forgets it, its KV
blocks come back (the block manager's /blocks), and nothing leaks."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from harness.deployment import blocks, get_json

MAX_TOKENS = 440  # ~3 s of the tiny model: far longer than the test waits after hanging up


def live_requests(dep, prefix: str) -> list[dict]:
    view = get_json(f"{dep.sup.scheduler_ops_url}/requests")
    return [r for r in view["requests"] if r["request_id"].startswith(prefix)]


def prefix_of(path: str, rid: str) -> str:
    """Scheduler ids of a request start with its response id: `cmpl-<X-Request-Id>` / `chatcmpl-...`."""
    return f"{'chatcmpl' if 'chat' in path else 'cmpl'}-{rid}"


def wait_until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def body(dep, path: str, stream: bool) -> dict:
    fields = {"model": dep.model_name, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream}
    if path == "/v1/completions":
        return {**fields, "prompt": list(range(5, 25))}
    return {**fields, "messages": [{"role": "user", "content": "Tell me everything."}]}


def assert_aborted_and_pool_whole(dep, prefix: str) -> None:
    wait_until(lambda: not live_requests(dep, prefix), 5, f"{prefix} to leave the scheduler")
    snap = wait_until(
        lambda: (s := blocks(dep.sup))["totals"]["free"] == s["totals"]["total"] and s,
        5,
        "the pool to be whole",
    )
    assert snap["totals"]["leaked"] == 0
    assert snap["invariants"]["ok"], snap["invariants"]
    log = (dep.log_dir / "scheduler.log").read_text()
    aborted = [json.loads(line) for line in log.splitlines() if '"request_aborted"' in line]
    mine = [e for e in aborted if e["request_id"].startswith(prefix)]
    assert mine, "the scheduler never saw an abort"
    # Cut short, not run out: the abort came before the request could finish on its own.
    assert mine[-1]["output_tokens"] < MAX_TOKENS, mine[-1]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_streaming_client_that_hangs_up_aborts_its_request_and_frees_its_blocks(api_deployment, path):
    dep = api_deployment
    rid = f"gone-stream-{path.count('/')}"
    headers = {"Authorization": f"Bearer {dep.api_key}", "X-Request-Id": rid}
    with httpx.Client(base_url=dep.api.base, headers=headers, timeout=30) as http:  # noqa: SIM117
        with http.stream("POST", path, json=body(dep, path, stream=True)) as reply:
            assert reply.status_code == 200
            lines = reply.iter_lines()
            chunks = [line for line in (next(lines) for _ in range(12)) if line.startswith("data:")]
            assert len(chunks) >= 4
            running = live_requests(dep, prefix_of(path, rid))
            assert running and running[0]["output_tokens"] < MAX_TOKENS
            assert blocks(dep.sup)["totals"]["used"] > 0
    # Leaving both blocks closed the connection mid-stream.
    assert_aborted_and_pool_whole(dep, prefix_of(path, rid))


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_non_streaming_client_that_hangs_up_aborts_its_request_and_frees_its_blocks(api_deployment, path):
    dep = api_deployment
    rid = f"gone-plain-{path.count('/')}"
    prefix = prefix_of(path, rid)
    payload = json.dumps(body(dep, path, stream=False)).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {dep.api_key}\r\nX-Request-Id: {rid}\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    # A raw socket: the request is sent whole, then the client just closes, as a killed process would.
    sock = socket.create_connection(("127.0.0.1", dep.api.port), timeout=10)
    try:
        sock.sendall(request)
        running = wait_until(
            lambda: [r for r in live_requests(dep, prefix) if r["output_tokens"] > 0],
            20,
            "the request to run",
        )
        assert running[0]["output_tokens"] < MAX_TOKENS
        assert blocks(dep.sup)["totals"]["used"] > 0
    finally:
        sock.close()
    assert_aborted_and_pool_whole(dep, prefix)


# Neither API takes ignore_eos: a JSON string of at least LONG characters keeps the tiny model from
# ending early (the grammar forbids the end of text before it), so the request is running when the
# client hangs up.
LONG = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 400}},
    "required": ["story"],
}
STREAMED_ELSEWHERE = {
    # path: (body, the scheduler ids' prefix, auth header); both ids are made up per response.
    "/v1/responses": (
        {
            "input": "Tell me everything.",
            "max_output_tokens": MAX_TOKENS,
            "text": {"format": {"type": "json_schema", "name": "long", "schema": LONG}},
        },
        "resp_",
        "Authorization",
    ),
    "/v1/messages": (
        {
            "messages": [{"role": "user", "content": "Tell me everything."}],
            "max_tokens": MAX_TOKENS,
            "output_config": {"format": {"type": "json_schema", "schema": LONG}},
        },
        "msg_",
        "x-api-key",
    ),
}


@pytest.mark.parametrize("path", sorted(STREAMED_ELSEWHERE))
def test_a_responses_or_messages_stream_whose_client_hangs_up_is_aborted(api_deployment, path):
    dep = api_deployment
    fields, prefix, auth = STREAMED_ELSEWHERE[path]
    key = f"Bearer {dep.api_key}" if auth == "Authorization" else dep.api_key
    payload = {"model": dep.model_name, "stream": True, **fields}
    with httpx.Client(base_url=dep.api.base, headers={auth: key}, timeout=30) as http:  # noqa: SIM117
        with http.stream("POST", path, json=payload) as reply:
            assert reply.status_code == 200
            deltas = 0
            # Held in a name: a bare `for ... in reply.iter_lines()` left by `break` drops the
            # generator, whose close closes the response: the client would hang up right there.
            lines = reply.iter_lines()
            for line in lines:  # a few tokens streamed: the request is running
                deltas += line.startswith("data:") and 'delta"' in line
                if deltas == 4:
                    break
            running = live_requests(dep, prefix)
            assert running and running[0]["output_tokens"] < MAX_TOKENS
            assert blocks(dep.sup)["totals"]["used"] > 0
    assert_aborted_and_pool_whole(dep, prefix)
