"""Named API keys over real HTTP: the key's name is the user the scheduler's per-user in-flight limit
counts, and a bad keys file stops the API at start, naming the file and the problem."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys

import httpx
import pytest
from harness.api_server import api_with_inflight_limit

KEYS = {"alice": "sk-alice-0123456789", "bob": "sk-bob-0123456789"}


@pytest.fixture(scope="module")
def keyed(tiny_model, tmp_path_factory):
    """A scheduler that lets each user have 2 requests live, behind an API with two named keys."""
    logs = tmp_path_factory.mktemp("api-keys")
    keys_file = logs / "keys.json"
    keys_file.write_text(json.dumps(KEYS))
    with api_with_inflight_limit(tiny_model("llama"), logs, 2, "--api-keys-file", str(keys_file)) as api:
        yield api


def test_a_user_at_its_limit_gets_429_while_another_key_is_served(keyed):
    def auth(name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {KEYS[name]}"}

    async def run() -> dict[str, object]:
        async with httpx.AsyncClient(base_url=keyed.base_url, timeout=60) as http:
            model = (await http.get("/models", headers=auth("bob"))).json()["data"][0]["id"]
            body = {"model": model, "prompt": [5, 6, 7], "max_tokens": 400, "ignore_eos": True}
            short = {**body, "max_tokens": 2}
            async with contextlib.AsyncExitStack() as running:
                streams = [
                    await running.enter_async_context(
                        http.stream(
                            "POST", "/completions", json={**body, "stream": True}, headers=auth("alice")
                        )
                    )
                    for _ in range(2)
                ]
                # headers come with the first token: both of alice's are live now
                return {
                    "running": [s.status_code for s in streams],
                    "alice": (await http.post("/completions", json=short, headers=auth("alice"))).status_code,
                    # the `user` field cannot move alice's request onto someone else's count
                    "alice_as_carol": (
                        await http.post(
                            "/completions", json={**short, "user": "carol"}, headers=auth("alice")
                        )
                    ).status_code,
                    "bob": (await http.post("/completions", json=short, headers=auth("bob"))).status_code,
                    "nobody": (await http.post("/completions", json=short)).status_code,
                    "wrong": (
                        await http.post("/completions", json=short, headers={"Authorization": "Bearer sk-x"})
                    ).status_code,
                }

    seen = asyncio.run(run())
    assert seen["running"] == [200, 200]
    assert seen["alice"] == 429 and seen["alice_as_carol"] == 429
    assert seen["bob"] == 200
    assert seen["nobody"] == seen["wrong"] == 401


def test_a_bad_keys_file_stops_the_api_at_start(tiny_model, tmp_path):
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text('alice = "sk-alice-0123456789"\nbob = "sk-alice-0123456789"\n')
    args = [sys.executable, "-m", "pagedserve.services.api", "--model", str(tiny_model("llama"))]
    args += ["--api-port", "9", "--api-keys-file", str(keys_file), "--log-format", "json"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert str(keys_file) in done.stderr + done.stdout
    assert "'alice' and 'bob' have the same key" in done.stderr + done.stdout
