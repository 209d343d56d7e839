"""Start the OpenAI-compatible API as a real subprocess (`python -m pagedserve.services.api`) in
front of a deployment from deployment.py, on a free port; stop it with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from harness.deployment import free_ports
from pagedserve.shared.config import ServeConfig


class ApiServer:
    def __init__(self, config: ServeConfig, log_path: Path, *extra_args: str) -> None:
        (self.port,) = free_ports(1)
        self.base = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.base}/v1"
        args = [
            sys.executable,
            "-m",
            "pagedserve.services.api",
            "--model",
            config.model,
            "--front-endpoint",
            config.front_endpoint,
            "--scheduler-ops-port",
            str(config.scheduler_ops_port),
            "--api-port",
            str(self.port),
            "--log-format",
            "json",
            *extra_args,
        ]
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=dict(os.environ))

    def wait_healthy(self, timeout_s: float = 180.0) -> None:  # imports alone take a minute on loaded cores
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the API exited with {self.proc.returncode}:\n{self.log_path.read_text()}"
                )
            try:
                reply = httpx.get(f"{self.base}/health", timeout=2)
                if reply.status_code == 200:
                    return
                last = reply.text
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.2)
        raise TimeoutError(
            f"the API was not healthy within {timeout_s} s: {last}\n{self.log_path.read_text()}"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# The arguments of the one tool the API tests offer (each API wraps it in its own shape: OpenAI's
# `parameters`, Anthropic's `input_schema`); maxLength 8 keeps a random model's city within max_tokens.
WEATHER_ARGUMENTS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}


def with_chat_template(folder: Path) -> Path:
    """Give a tiny model (byte tokenizer, no template) a small chat template of its own."""
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return folder


@contextmanager
def api_with_inflight_limit(model: Path, log_dir: Path, limit: int, *api_args: str) -> Iterator[ApiServer]:
    """A one-worker deployment whose scheduler lets each client (or user) have `limit` requests live,
    behind one API process started with `api_args`; both stopped on exit."""
    from harness.deployment import start

    sup = start(model, workers=1, log_dir=log_dir, max_inflight_per_client=limit)
    api = ApiServer(sup.config, log_dir / "api.log", *api_args)
    try:
        api.wait_healthy()
        yield api
    finally:
        api.stop()
        sup.stop()
