"""The API keeps an idle HTTP connection open longer than clients' pools trust one (httpx and the
openai SDK: 5 s), so a client never sends a request on a connection the server is closing: that race
was the `httpx.ReadError` (a reset) of the front-door load test. And it lifts its open-files limit,
one descriptor per connection."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
from harness.deployment import free_ports

IDLE_S = 6.0  # past uvicorn's default keep-alive (5 s) and httpx's pool expiry (5 s)


def start_api(model: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """The real API process, with a soft open-files limit of 1,024 (a common default). No scheduler
    behind it: /v1/models answers from the model card alone."""
    (port,) = free_ports(1)
    args = ["prlimit", "--nofile=1024:8192", sys.executable, "-m", "pagedserve.services.api"]
    args += ["--model", str(model), "--front-endpoint", "tcp://127.0.0.1:9", "--api-port", str(port)]
    proc = subprocess.Popen([*args, "--log-format", "json"], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(log.read_text())


def local_port(reply: httpx.Response) -> int:
    return reply.extensions["network_stream"].get_extra_info("client_addr")[1]


def test_an_idle_connection_outlives_the_clients_pool_expiry(tiny_model, tmp_path):
    proc, base = start_api(tiny_model("llama"), tmp_path / "api.log")
    try:
        # A pool that trusts idle connections for 30 s (aiohttp 15 s, Go 90 s): the server must not
        # be the side that closes first, or a request sent as it closes is reset.
        limits = httpx.Limits(keepalive_expiry=30.0)
        with httpx.Client(limits=limits, timeout=10) as http:
            first = http.get(f"{base}/models")
            first_port = local_port(first)
            time.sleep(IDLE_S)
            second = http.get(f"{base}/models")
            second_port = local_port(second)
        assert first.status_code == second.status_code == 200
        assert second_port == first_port, "the server closed the idle connection"
        limits_text = Path(f"/proc/{proc.pid}/limits").read_text()
        (line,) = [x for x in limits_text.splitlines() if x.startswith("Max open files")]
        soft, hard = line.split()[3:5]
        assert soft == hard == "8192", line
    finally:
        proc.terminate()
        proc.wait(timeout=20)
