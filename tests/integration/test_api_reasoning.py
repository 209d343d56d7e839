"""--reasoning-parser through the real API, on the shared word-model deployment (its tokenizer has
`<think>` and `</think>` as single tokens, its template closes an empty block when enable_thinking is
false). logit_bias steers the random model: a bias on `</think>` makes it the first token."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from harness.api_server import ApiServer
from openai.types.chat import ChatCompletion
from transformers import AutoTokenizer

MODEL = "tiny-reranker"
TURNS = [{"role": "user", "content": "Pick a colour."}]
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "blue"]}},
    "required": ["colour"],
    "additionalProperties": False,
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def servers(word_model_deployment):
    dep = word_model_deployment
    r1 = ApiServer(dep.sup.config, dep.log_dir / "api-r1.log", "--reasoning-parser", "deepseek_r1")
    q3 = ApiServer(dep.sup.config, dep.log_dir / "api-q3.log", "--reasoning-parser", "qwen3")
    try:
        r1.wait_healthy()
        q3.wait_healthy()
        yield dep, r1, q3
    finally:
        r1.stop()
        q3.stop()


def client_of(server: ApiServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def close_think_id(dep) -> int:
    return AutoTokenizer.from_pretrained(dep.model_path).convert_tokens_to_ids("</think>")


def pick_a_colour(client: openai.OpenAI, **options: Any) -> ChatCompletion:
    """A greedy answer to TURNS held to the schema, with room (40 tokens) for thinking before it."""
    return client.chat.completions.create(
        model=MODEL, messages=TURNS, max_tokens=40, temperature=0, response_format=JSON_FORMAT, **options
    )


def test_an_unclosed_block_is_all_reasoning_streamed_as_its_own_deltas(servers):
    _, r1, _ = servers
    client = client_of(r1)
    kwargs = {"model": MODEL, "messages": TURNS, "max_tokens": 12, "temperature": 0}
    whole = client.chat.completions.create(**kwargs).choices[0].message
    assert (
        whole.content == "" and whole.model_extra["reasoning_content"]
    )  # deepseek_r1: thinking until </think>
    assert whole.model_extra["reasoning"] == whole.model_extra["reasoning_content"]
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert streamed == whole.model_extra["reasoning_content"]
    assert not "".join(d.content or "" for d in deltas)


def test_a_schema_applies_to_the_answer_after_the_thinking(servers):
    dep, r1, _ = servers
    reply = pick_a_colour(client_of(r1), logit_bias={str(close_think_id(dep)): 100})
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"] == ""  # it closed the block at once
    assert json.loads(message.content)["colour"] in ("red", "blue")  # then the grammar ruled


def test_enable_thinking_false_reaches_the_template_and_the_grammar_starts_at_once(servers):
    _, _, q3 = servers
    client = client_of(q3)
    reply = pick_a_colour(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"] is None  # the template closed the block: no thinking
    assert json.loads(message.content)["colour"] in ("red", "blue")
    on = client.chat.completions.create(model=MODEL, messages=TURNS, max_tokens=1, temperature=0)
    assert reply.usage.prompt_tokens > on.usage.prompt_tokens  # the closed block is in the prompt
