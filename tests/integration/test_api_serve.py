"""`pagedserve serve MODEL` starts everything, the API included, prints its base URL, and restarts
the API when it dies: the openai client gets answers before and after."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
from harness.api_server import with_chat_template
from harness.deployment import free_ports

from pagedserve.ops.deploy.ops_client import wait_ok


def api_pid(parent: int) -> int:
    for pid in subprocess.check_output(["pgrep", "-P", str(parent)], text=True).split():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f.read().split(b"\0")[-2:-1] == [b"api"]:
                return int(pid)
    raise AssertionError("no api child")


def test_serve_starts_the_api_prints_its_url_and_restarts_it_after_a_crash(tiny_model, tmp_path):
    folder = with_chat_template(Path(shutil.copytree(tiny_model("llama"), tmp_path / "tiny-chat")))
    front, workers, bm, sched_ops, bm_ops, api_port = free_ports(6)
    argv = [
        sys.executable, "-m", "pagedserve.ops.cli", "serve", str(folder),
        "--front-endpoint", f"tcp://127.0.0.1:{front}",
        "--worker-endpoint", f"tcp://127.0.0.1:{workers}",
        "--block-manager-endpoint", f"tcp://127.0.0.1:{bm}",
        "--scheduler-ops-port", str(sched_ops), "--block-manager-ops-port", str(bm_ops),
        "--api-port", str(api_port), "--num-blocks", "128", "--num-threads", "1",
        "--log-dir", str(tmp_path), "--ready-timeout", "120",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEDSERVE_") or k == "PAGEDSERVE_CACHE"}
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert up.stdout is not None
        lines: list[str] = []
        while not (lines and lines[-1].startswith("ready in")):
            lines.append(up.stdout.readline())
            assert lines[-1], f"serve exited before it was ready: {''.join(lines)}"
        base_url = f"http://127.0.0.1:{api_port}/v1"
        assert any(line.startswith(f"OpenAI-compatible API: {base_url}") for line in lines), lines

        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        name = folder.name  # served under the model folder's name
        ask = {
            "model": name,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
            "temperature": 0,
        }
        before = client.chat.completions.create(**ask).choices[0].message.content

        os.kill(api_pid(up.pid), signal.SIGKILL)
        time.sleep(0.5)
        wait_ok(base_url.removesuffix("/v1") + "/health", 60)  # the API came back
        assert client.chat.completions.create(**ask).choices[0].message.content == before

        up.send_signal(signal.SIGTERM)
        out, _ = up.communicate(timeout=30)
        assert up.returncode == 0 and "api=" in out
    finally:
        up.kill()
        up.wait()
