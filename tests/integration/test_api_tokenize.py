"""/tokenize, /detokenize and /version over raw HTTP (vLLM's shapes), against the shared deployment:
the ids are those the tokenizer and the chat template give, and a completion of them reports as many
prompt tokens."""

from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer

MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def http(api_deployment):
    headers = {"Authorization": f"Bearer {api_deployment.api_key}"}
    with httpx.Client(base_url=api_deployment.api.base, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def tokenizer(api_deployment):
    return AutoTokenizer.from_pretrained(str(api_deployment.model_path))


def test_tokenize_a_prompt_and_detokenize_it_back(http, tokenizer, api_deployment):
    reply = http.post(
        "/tokenize", json={"model": api_deployment.model_name, "prompt": "héllo", "return_token_strs": True}
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["tokens"] == tokenizer.encode("héllo") and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 512 and body["token_strs"] == tokenizer.convert_ids_to_tokens(
        body["tokens"]
    )
    back = http.post("/detokenize", json={"tokens": body["tokens"]}).json()
    assert back == {"prompt": "héllo"}
    usage = http.post(
        "/v1/completions", json={"model": api_deployment.model_name, "prompt": "héllo", "max_tokens": 1}
    ).json()["usage"]
    assert usage["prompt_tokens"] == body["count"]


def test_tokenize_messages_through_the_chat_template(http, tokenizer, api_deployment):
    body = http.post("/tokenize", json={"messages": MESSAGES}).json()
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert body["tokens"] == tokenizer.encode(text, add_special_tokens=False)
    chat = http.post(
        "/v1/chat/completions",
        json={"model": api_deployment.model_name, "messages": MESSAGES, "max_tokens": 1},
    ).json()
    assert chat["usage"]["prompt_tokens"] == body["count"]
    without = http.post("/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert body["tokens"][: without["count"]] == without["tokens"] and without["count"] < body["count"]


def test_bad_tokenize_requests_name_their_field(http):
    both = http.post("/tokenize", json={"prompt": "a", "messages": MESSAGES})
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt"
    wrong = http.post("/tokenize", json={"model": "nope", "prompt": "a"})
    assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"
    big = http.post("/detokenize", json={"tokens": [1, 10**6]})
    assert big.status_code == 400 and big.json()["error"]["param"] == "tokens"
    clash = http.post("/tokenize", json={"messages": MESSAGES, "chat_template_kwargs": {"tools": []}})
    assert clash.status_code == 400 and clash.json()["error"]["param"] == "chat_template_kwargs"


def test_version_needs_no_key(api_deployment):
    reply = httpx.get(f"{api_deployment.api.base}/version", timeout=10)
    assert reply.status_code == 200 and reply.json()["version"]
