"""`tool_choice: "auto"` end to end: the model's own text is read by the Hermes parser.

A random tiny model never writes `<tool_call>` by itself, so its output is steered with vLLM's
`structured_outputs` regex beside `tools` (auto constrains nothing, so the two combine). What is
tested is the API's path from generated text to `tool_calls`: parsed, validated against the tool's
schema, `finish_reason: "tool_calls"`, and streamed deltas that join to the unstreamed answer.
"""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel, Field

SEEDS = range(3)
MESSAGES = [{"role": "user", "content": "What is the weather?"}]
# Hermes' format: an optional lead-in, then one JSON object naming the tool and its arguments.
CALL_REGEX = (
    r'Let me check\. <tool_call>\{"name": "Weather", "arguments": '
    r'\{"city": "[a-z]{1,8}", "days": [1-7]\}\}</tool_call>'
)


class Weather(BaseModel):
    city: str = Field(max_length=8)
    days: int = Field(ge=1, le=7)


@pytest.fixture(scope="module")
def client(api_deployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=api_deployment.api.base_url, api_key=api_deployment.api_key, max_retries=0)


def _ask(client, api_deployment, regex: str, seed: int, stream: bool):
    return client.chat.completions.create(
        model=api_deployment.model_name,
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(Weather)],
        tool_choice="auto",
        temperature=1.0,
        seed=seed,
        max_tokens=120,
        stream=stream,
        extra_body={"structured_outputs": {"regex": regex}},
    )


def _joined(chunks) -> tuple[str, list[dict[str, str]], str | None]:
    """A stream's content, its tool calls (by index, arguments joined) and its last finish_reason."""
    content, calls, reason = "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += call.id or ""
            entry["name"] += (call.function.name or "") if call.function else ""
            entry["arguments"] += (call.function.arguments or "") if call.function else ""
        reason = choice.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def test_auto_reads_a_hermes_tool_call_out_of_the_output(client, api_deployment):
    for seed in SEEDS:
        reply = _ask(client, api_deployment, CALL_REGEX, seed, stream=False)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content == "Let me check. "
        (call,) = choice.message.tool_calls
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name == "Weather"
        Weather.model_validate_json(call.function.arguments)


def test_auto_streams_the_same_call_as_openai_tool_call_deltas(client, api_deployment):
    for seed in SEEDS:
        reply = _ask(client, api_deployment, CALL_REGEX, seed, stream=False)
        content, calls, reason = _joined(_ask(client, api_deployment, CALL_REGEX, seed, stream=True))
        assert reason == "tool_calls"
        assert content == reply.choices[0].message.content
        (call,) = calls
        assert call["id"].startswith("call_") and call["name"] == "Weather"
        expected = reply.choices[0].message.tool_calls[0].function.arguments
        assert json.loads(call["arguments"]) == json.loads(expected)  # same seed, same sampled tokens


def test_auto_output_that_is_no_tool_call_stays_content(client, api_deployment):
    regex = "[a-z]{3,12} <tool_call>\\{[a-z]{1,5}\\}</tool_call>"  # a block that holds no call
    for stream in (False, True):
        answer = _ask(client, api_deployment, regex, 0, stream)
        if stream:
            content, calls, reason = _joined(answer)
        else:
            choice = answer.choices[0]
            content, calls, reason = choice.message.content, choice.message.tool_calls, choice.finish_reason
        assert not calls
        assert reason == "stop"
        assert "<tool_call>{" in content and content.endswith("}</tool_call>")
