"""Every error class of the HTTP API: its status and OpenAI's body, `{"error": {message, type, param, code}}`.

Bad input is a 400 naming the field and the limit (never a 500), and never disturbs other requests."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import openai
import pytest
from harness.api_server import ApiServer, api_with_inflight_limit
from harness.deployment import deployment_config, free_ports


def post(dep, path: str, body, *, key: str | None = "default", **kwargs) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {dep.api_key if key == 'default' else key}"}
    return httpx.post(f"{dep.api.base_url}{path}", headers=headers, json=body, timeout=30, **kwargs)


def assert_error(reply: httpx.Response, status: int, param: str | None, *words: str) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    for word in words:
        assert word in error["message"], error
    return error


def completion(dep, **fields) -> dict:
    return {"model": dep.model_name, "prompt": "Hi", "max_tokens": 4, **fields}


def chat(dep, **fields) -> dict:
    return {
        "model": dep.model_name,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        **fields,
    }


def test_a_missing_or_wrong_api_key_is_a_401(api_deployment):
    error = assert_error(
        post(api_deployment, "/completions", completion(api_deployment), key=None), 401, None
    )
    assert error["type"] == "authentication_error"
    assert_error(post(api_deployment, "/completions", completion(api_deployment), key="wrong"), 401, None)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=api_deployment.api.base_url, api_key="wrong", max_retries=0).models.list()


def test_health_and_metrics_need_no_key(api_deployment):
    assert httpx.get(f"{api_deployment.api.base}/health", timeout=10).json()["status"] == "ok"
    assert httpx.get(f"{api_deployment.api.base}/metrics", timeout=10).status_code == 200


def test_an_unknown_model_or_route_is_a_404(api_deployment):
    error = assert_error(
        post(api_deployment, "/completions", completion(api_deployment, model="gpt-9")), 404, "model", "gpt-9"
    )
    assert error["code"] == "model_not_found"
    assert_error(post(api_deployment, "/nowhere", {}), 404, None, "/v1/nowhere")
    client = openai.OpenAI(
        base_url=api_deployment.api.base_url, api_key=api_deployment.api_key, max_retries=0
    )
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"temperature": -1}, "temperature", ["greater than or equal to 0"]),
        ({"n": 100}, "n", ["less than or equal to 16"]),
        ({"top_p": 0}, "top_p", ["greater than 0"]),
        ({"max_tokens": 0}, "max_tokens", ["greater than or equal to 1"]),
        ({"logprobs": 50}, "logprobs", ["less than or equal to 20"]),
        ({"frobnicate": True}, "frobnicate", ["unknown field"]),
        ({"prompt": []}, "prompt", ["empty"]),
        ({"prompt": list(range(3, 603))}, "prompt", ["600 tokens", "max_model_len", "512"]),
        ({"max_tokens": 600}, "max_tokens", ["max_tokens=600", "512"]),
        ({"prompt": [5, 100000]}, "prompt", ["100000", "vocabulary"]),
        ({"suffix": "x"}, "suffix", ["not supported"]),
        ({"logit_bias": {"5000": 1.0}}, "logit_bias", ["logit_bias", "5000", "vocabulary"]),
        ({"stream": True, "prompt": list(range(3, 603))}, "prompt", ["max_model_len"]),
    ],
)
def test_an_invalid_completion_field_is_a_400_naming_it(api_deployment, fields, param, words):
    error = assert_error(
        post(api_deployment, "/completions", completion(api_deployment, **fields)), 400, param, *words
    )
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "tool_choice",
            ["'g'", "not among tools"],
        ),
        ({"tool_choice": "auto"}, "tool_choice", ["needs tools"]),
        ({"guided_regex": "[a-"}, "guided_regex", ["guided_regex"]),
        ({"messages": []}, "messages", ["at least 1"]),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", ["system"]),
        ({"top_logprobs": 3}, "top_logprobs", ["logprobs=true"]),
        ({"logprobs": True, "top_logprobs": 30}, "top_logprobs", ["less than or equal to 20"]),
        ({"max_completion_tokens": 0}, "max_completion_tokens", ["greater than or equal to 1"]),
        ({"messages": [{"role": "user", "content": "x" * 600}]}, "messages", ["max_model_len"]),
    ],
)
def test_an_invalid_chat_field_is_a_400_naming_it(api_deployment, fields, param, words):
    assert_error(
        post(api_deployment, "/chat/completions", chat(api_deployment, **fields)), 400, param, *words
    )


def test_a_body_that_is_not_json_is_a_400(api_deployment):
    reply = httpx.post(
        f"{api_deployment.api.base_url}/completions",
        headers={"Authorization": f"Bearer {api_deployment.api_key}", "Content-Type": "application/json"},
        content=b"{not json",
        timeout=10,
    )
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"


def test_the_openai_client_raises_bad_request_with_the_message(api_deployment):
    client = openai.OpenAI(
        base_url=api_deployment.api.base_url, api_key=api_deployment.api_key, max_retries=0
    )
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=api_deployment.model_name, prompt="x", temperature=-1)
    assert caught.value.status_code == 400 and "temperature" in caught.value.message


def test_bad_requests_do_not_disturb_a_good_one_running_beside_them(api_deployment):
    async def run() -> tuple[dict, list[int]]:
        headers = {"Authorization": f"Bearer {api_deployment.api_key}"}
        async with httpx.AsyncClient(
            base_url=api_deployment.api.base_url, headers=headers, timeout=60
        ) as http:
            good = asyncio.create_task(
                http.post("/completions", json=completion(api_deployment, max_tokens=40, temperature=0))
            )
            bad = await asyncio.gather(
                *(
                    http.post("/completions", json=completion(api_deployment, temperature=-i - 1))
                    for i in range(20)
                )
            )
            return (await good).json(), [r.status_code for r in bad]

    good, bad = asyncio.run(run())
    assert bad == [400] * 20
    assert good["usage"]["completion_tokens"] > 0 and good["choices"][0]["finish_reason"] in (
        "stop",
        "length",
    )


# ---------------------------------------------------------------- 429 and 503 need their own processes


@pytest.fixture(scope="module")
def limited(tiny_model, tmp_path_factory):
    """A scheduler that lets one client (the API is one) have only 2 requests live."""
    with api_with_inflight_limit(tiny_model("llama"), tmp_path_factory.mktemp("api-limited"), 2) as api:
        yield api


def test_a_scheduler_refusing_for_load_is_a_429(limited):
    async def run() -> tuple[int, dict, list[int]]:
        async with httpx.AsyncClient(base_url=limited.base_url, timeout=60) as http:
            model = (await http.get("/models")).json()["data"][0]["id"]
            body = {"model": model, "prompt": [5, 6, 7], "max_tokens": 400, "ignore_eos": True}
            async with contextlib.AsyncExitStack() as running:
                replies = [
                    await running.enter_async_context(
                        http.stream("POST", "/completions", json={**body, "stream": True})
                    )
                    for _ in range(2)
                ]
                # headers come with the first token: both are running now
                refused = await http.post("/completions", json={**body, "max_tokens": 2})
            return refused.status_code, refused.json(), [r.status_code for r in replies]

    status, body, running = asyncio.run(run())
    assert running == [200, 200]
    assert status == 429, body
    assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "too_many_requests"


def test_an_unreachable_scheduler_is_a_503_after_the_timeout(tiny_model, tmp_path):
    front, ops = free_ports(2)
    config = deployment_config(
        tiny_model("llama"), front_endpoint=f"tcp://127.0.0.1:{front}", scheduler_ops_port=ops
    )
    api = ApiServer(config, tmp_path / "api.log", "--request-timeout-s", "2")
    try:
        deadline = time.monotonic() + 60
        while True:  # /health answers 503 (it never turns 200 here)
            try:
                health = httpx.get(f"{api.base}/health", timeout=5)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, api.log_path.read_text()
                time.sleep(0.2)
        assert health.status_code == 503 and "unreachable" in health.json()["reason"]
        started = time.monotonic()
        name = httpx.get(f"{api.base_url}/models", timeout=5).json()["data"][0]["id"]
        reply = httpx.post(f"{api.base_url}/completions", json={"model": name, "prompt": "Hi"}, timeout=30)
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["type"] == "service_unavailable_error"
        assert 1.5 < time.monotonic() - started < 10
    finally:
        api.stop()


def test_the_inflight_limit_counts_per_user_behind_one_api_process(limited):
    """The API is one SDK client; the `user` field makes each user its own client for the limit."""

    async def run() -> tuple[list[int], int, int]:
        async with httpx.AsyncClient(base_url=limited.base_url, timeout=60) as http:
            model = (await http.get("/models")).json()["data"][0]["id"]
            body = {"model": model, "prompt": [5, 6, 7], "max_tokens": 400, "ignore_eos": True}
            async with contextlib.AsyncExitStack() as running:
                replies = [
                    await running.enter_async_context(
                        http.stream("POST", "/completions", json={**body, "stream": True, "user": "alice"})
                    )
                    for _ in range(2)
                ]
                alice = await http.post("/completions", json={**body, "max_tokens": 2, "user": "alice"})
                bob = await http.post("/completions", json={**body, "max_tokens": 2, "user": "bob"})
            return [r.status_code for r in replies], alice.status_code, bob.status_code

    running, alice, bob = asyncio.run(run())
    assert running == [200, 200]
    assert alice == 429  # alice is at max_inflight_per_client=2
    assert bob == 200  # bob is not, though his request came through the same API process
