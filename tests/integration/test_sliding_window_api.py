"""Sliding windows are exact, so they no longer cap the context: a prompt longer than the window runs
and gives transformers' greedy tokens, in-process (Mistral, window 32) and through the services and
the OpenAI-compatible HTTP API (Phi-3 with LongRoPE: a window of 29 in every layer, half of each head
rotated, and requests that cross the original context of 48 while generating, which the scheduler
service recomputes with the long factors as transformers does)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from harness.api_server import ApiServer
from harness.deployment import start
from harness.parity import transformers_greedy
from harness.tiny_models import LONGROPE_ORIGINAL

from pagedserve import LLM, SamplingParams

MAX_TOKENS = 10


def test_in_process_a_prompt_past_the_window_gives_transformers_tokens(tiny_model) -> None:
    path = tiny_model("mistral", sliding_window=32)
    prompts = [[5 + i % 200 for i in range(n)] for n in (40, 90)]
    llm = LLM(str(path), num_blocks=64)
    assert llm.max_model_len == 512  # the positions, not the window
    got = [o.token_ids for o in llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))]
    assert got == transformers_greedy(path, prompts, MAX_TOKENS)


# 20: short factors throughout; 44: crosses 48 while generating (recomputed); 70: long from the start.
API_PROMPTS = [[3 + (7 * i + n) % 250 for i in range(n)] for n in (20, 44, 70)]


@pytest.fixture(scope="module")
def longrope(tiny_model) -> tuple[str, list[tuple[str, int]]]:
    """(the checkpoint, per prompt: the text of transformers' greedy tokens as our engine detokenizes
    them, and how many there are)."""
    path = tiny_model("phi3-longrope")
    expected = transformers_greedy(path, API_PROMPTS, MAX_TOKENS)
    llm = LLM(str(path), num_blocks=64, block_size=16)
    outs = llm.generate(API_PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == expected
    assert llm.scheduler.stats.rope_recomputes == 1  # the 44-token prompt crossed 48
    assert 20 + MAX_TOKENS <= LONGROPE_ORIGINAL < 44 + MAX_TOKENS
    return str(path), [(o.text, len(o.token_ids)) for o in outs]


@pytest.fixture(scope="module")
def api(longrope, tmp_path_factory) -> Iterator[str]:
    """The API's base URL, in front of a deployment of the LongRoPE model (one worker process)."""
    logs = tmp_path_factory.mktemp("window-logs")
    sup = start(longrope[0], workers=1, log_dir=logs, block_size=16, num_blocks=64)
    api = ApiServer(sup.config, logs / "api.log")
    try:
        api.wait_healthy()
        yield api.base_url
    finally:
        api.stop()
        sup.stop()


def test_through_the_api_windows_and_longrope_give_transformers_tokens(longrope, api) -> None:
    _, expected_text = longrope
    (model,) = httpx.get(f"{api}/models", timeout=10).json()["data"]
    assert model["max_model_len"] == 192  # the positions, not the window of 29
    for prompt, expected in zip(API_PROMPTS, expected_text, strict=True):
        reply = httpx.post(
            f"{api}/completions",
            json={"model": model["id"], "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert (choice["text"], reply.json()["usage"]["completion_tokens"]) == expected
