"""A Mistral-style model whose sliding window (32) is shorter than its positions (512): a prompt
longer than the window gets the same clear refusal in-process, through the services (SDK) and
through the HTTP API, and a prompt within it still runs. Sliding-window attention is not
implemented, so the window is the context served exactly (services/checkpoint.py)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from harness.api_server import ApiServer
from harness.deployment import start
from pagedserve.services.scheduler.admission import RequestRejected
from pagedserve.shared.sdk import RequestError

from pagedserve import LLM, Client, SamplingParams

WINDOW = 32
TOO_LONG = [5] * 40  # within the 512 positions, past the window
EXPECTED = (
    "prompt_too_long",
    f"prompt has 40 tokens; the model's context (max_model_len) is {WINDOW}, "
    "leaving room for at least one generated token",
)


@pytest.fixture(scope="module")
def windowed_model(tiny_model):
    return tiny_model("mistral", sliding_window=WINDOW)


@pytest.fixture(scope="module")
def deployment(windowed_model, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """(the scheduler's front endpoint, the API's base URL)."""
    logs = tmp_path_factory.mktemp("window-logs")
    sup = start(windowed_model, workers=1, log_dir=logs)
    api = ApiServer(sup.config, logs / "api.log")
    try:
        api.wait_healthy()
        yield sup.config.front_endpoint, api.base_url
    finally:
        api.stop()
        sup.stop()


def test_in_process_the_window_refuses_a_longer_prompt(windowed_model) -> None:
    llm = LLM(str(windowed_model), num_blocks=64)
    with pytest.raises(RequestRejected) as refused:
        llm.generate([TOO_LONG], SamplingParams(max_tokens=1))
    assert (refused.value.code, refused.value.message) == EXPECTED
    assert len(llm.generate([[5] * 20], SamplingParams(max_tokens=4))[0].token_ids) == 4


def test_through_the_services_the_window_refuses_a_longer_prompt(deployment) -> None:
    front, _ = deployment
    with Client(front, timeout_s=60) as client:
        with pytest.raises(RequestError) as refused:
            client.generate(prompt_token_ids=TOO_LONG, max_tokens=1)
        assert (refused.value.code, refused.value.message) == EXPECTED
        assert len(client.generate(prompt_token_ids=[5] * 20, max_tokens=4).token_ids) == 4


def test_through_the_api_the_window_refuses_a_longer_prompt(deployment) -> None:
    _, base_url = deployment
    (model,) = httpx.get(f"{base_url}/models", timeout=10).json()["data"]
    assert model["max_model_len"] == WINDOW
    reply = httpx.post(
        f"{base_url}/completions",
        json={"model": model["id"], "prompt": TOO_LONG, "max_tokens": 1},
        timeout=60,
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["code"], error["message"], error["param"]) == (*EXPECTED, "prompt")
