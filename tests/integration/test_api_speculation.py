"""Speculative decoding per request over real HTTP: `speculate` and `num_speculative_tokens` on
chat/completions, completions and the Responses API (our extension fields).

A deployment of its own (prompt lookup with 1-grams, so every decode of a repeating prompt proposes):
greedy text is the same with speculation on, capped and off; the scheduler's proposed-token counter
moves only when the request lets it; a bad value is a 400 naming the field and its limit, and the
service serves the next request."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import httpx
import pytest
from harness.api_server import ApiServer, with_chat_template
from harness.deployment import start
from prometheus_client.parser import text_string_to_metric_families

SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "max_step_rows": 64, "row_cost": 0.0}'
# Every printable ASCII character: with 1-grams, prompt lookup proposes after most tokens the model emits.
PROMPT = "".join(chr(c) for c in range(32, 127)) * 2
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, str]]:
    folder = tmp_path_factory.mktemp("spec-api-model") / "tiny-spec"
    shutil.copytree(tiny_model("llama"), folder)
    with_chat_template(folder)
    logs = tmp_path_factory.mktemp("spec-api-logs")
    sup = start(folder, workers=1, log_dir=logs, speculative_config=SPEC)
    api = ApiServer(sup.config, logs / "api.log")
    try:
        api.wait_healthy()
        yield api, sup.scheduler_ops_url
    finally:
        api.stop()
        sup.stop()


def metric(ops_url: str, name: str, sample_suffix: str = "") -> float:
    text = httpx.get(f"{ops_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(s.value for s in family.samples if s.name.endswith(sample_suffix))
    raise AssertionError(f"no {name} on the scheduler's /metrics")


def proposed(ops_url: str) -> float:
    return metric(ops_url, "pagedserve_spec_proposed_tokens", "_total")


def post(api: ApiServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{api.base_url}{path}", json=body, timeout=60)


def answer(path: str, reply: dict) -> str:
    if path == "/chat/completions":
        return reply["choices"][0]["message"]["content"]
    if path == "/completions":
        return reply["choices"][0]["text"]
    return "".join(c["text"] for item in reply["output"] for c in item.get("content", []))


def body(path: str, **extra) -> dict:
    common = {"model": "tiny-spec", "temperature": 0, **extra}
    if path == "/chat/completions":
        return {**common, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS}
    if path == "/completions":
        return {**common, "prompt": PROMPT, "max_tokens": MAX_TOKENS}
    return {**common, "input": PROMPT, "max_output_tokens": MAX_TOKENS}


ENDPOINTS = ["/chat/completions", "/completions", "/responses"]


@pytest.mark.parametrize("path", ENDPOINTS)
def test_greedy_text_is_the_same_with_speculation_on_capped_and_off(served, path):
    api, ops = served
    before = proposed(ops)
    off = post(api, path, body(path, speculate=False))
    assert off.status_code == 200, off.text
    assert proposed(ops) == before, "speculate=false: nothing may be proposed"
    capped = post(api, path, body(path, num_speculative_tokens=1))
    on = post(api, path, body(path))
    assert capped.status_code == on.status_code == 200, (capped.text, on.text)
    after = proposed(ops)
    assert after > before, "the repeating prompt gets proposals when speculation is on"
    assert metric(ops, "pagedserve_spec_row_cost") == 0.0  # the configured price, whatever the steps measure
    assert answer(path, off.json()) == answer(path, capped.json()) == answer(path, on.json())
    zero = post(api, path, body(path, num_speculative_tokens=0))
    assert zero.status_code == 200 and proposed(ops) == after, "a cap of 0 proposes nothing"
    assert answer(path, zero.json()) == answer(path, off.json())


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("num_speculative_tokens", 17, "less than or equal to 16"),
        ("num_speculative_tokens", -1, "greater than or equal to 0"),
        ("speculate", "sometimes", "bool"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field_and_the_service_keeps_serving(
    served, path, field, value, says
):
    api, _ = served
    bad = post(api, path, body(path, **{field: value}))
    assert bad.status_code == 400, bad.text
    error = bad.json()["error"]
    assert field in error["message"] and says in error["message"], error
    good = post(api, path, body(path))
    assert good.status_code == 200, good.text
