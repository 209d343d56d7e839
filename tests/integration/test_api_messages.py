"""POST /v1/messages driven by Anthropic's own `anthropic` client against the shared deployment (a
tiny random Llama with a chat template): greedy text equal to chat completions' for the same turns,
streamed and not, a tool-use turn and its tool_result, stop sequences, count_tokens, and errors in
Anthropic's shape."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from harness.api_server import WEATHER_ARGUMENTS

SYSTEM = "Be terse."
GREEDY = {"temperature": 0}  # the newest anthropic client has no temperature argument: sent as a body field
TURNS = [{"role": "user", "content": "Name a colour."}]
TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": WEATHER_ARGUMENTS,
}


@pytest.fixture(scope="module")
def client(api_deployment) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=api_deployment.api.base, api_key=api_deployment.api_key, max_retries=0
    )


@pytest.fixture(scope="module")
def chat(api_deployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=api_deployment.api.base_url, api_key=api_deployment.api_key, max_retries=0)


def greedy_chat(chat, model: str, max_tokens: int) -> tuple[str, int]:
    messages = [{"role": "system", "content": SYSTEM}, *TURNS]
    reply = chat.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
    return reply.choices[0].message.content, reply.usage.prompt_tokens


def test_a_message_equals_the_chat_completion_of_the_same_turns(client, chat, api_deployment):
    model = api_deployment.model_name
    reply = client.messages.create(
        model=model, system=SYSTEM, messages=TURNS, max_tokens=12, extra_body=GREEDY
    )
    want, prompt_tokens = greedy_chat(chat, model, 12)
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text == want
    assert reply.stop_reason in ("end_turn", "max_tokens")
    assert reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0) == prompt_tokens
    count = client.messages.count_tokens(model=model, system=SYSTEM, messages=TURNS)
    assert count.input_tokens == prompt_tokens


def test_streamed_events_add_up_to_the_message(client, api_deployment):
    kwargs = {
        "model": api_deployment.model_name,
        "system": SYSTEM,
        "messages": TURNS,
        "max_tokens": 16,
        "extra_body": GREEDY,
    }
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    kinds = [e.type for e in client.messages.create(stream=True, **kwargs) if e.type != "ping"]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}


def test_a_stop_sequence_ends_the_text_and_is_named(client, api_deployment):
    kwargs = {"model": api_deployment.model_name, "messages": TURNS, "max_tokens": 24, "extra_body": GREEDY}
    text = client.messages.create(**kwargs).content[0].text
    stop = text[6:9]
    assert len(stop) == 3 and text.find(stop) >= 6
    reply = client.messages.create(stop_sequences=[stop, "never-seen"], **kwargs)
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == stop
    assert reply.content[0].text == text[: text.find(stop)]
    with client.messages.stream(stop_sequences=[stop], **kwargs) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == reply.content[0].text and final.stop_sequence == stop


def test_a_tool_use_turn_and_its_result(client, api_deployment):
    model = api_deployment.model_name
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.messages.create(
        model=model,
        messages=ask,
        tools=[TOOL],
        tool_choice={"type": "any"},
        max_tokens=150,
        extra_body=GREEDY,
    )
    uses = [b for b in reply.content if b.type == "tool_use"]
    assert reply.stop_reason == "tool_use" and uses
    assert uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    assert set(uses[0].input) == {"city", "unit"} and uses[0].input["unit"] in ("c", "f")
    with client.messages.stream(
        model=model,
        messages=ask,
        tools=[TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        max_tokens=150,
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "tool_use" and final.content[0].input["unit"] in ("c", "f")
    follow = [
        *ask,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "21 C"}]},
    ]
    answer = client.messages.create(
        model=model, messages=follow, tools=[TOOL], max_tokens=8, extra_body=GREEDY
    )
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")

    def prompt(usage) -> int:
        return usage.input_tokens + (usage.cache_read_input_tokens or 0)

    assert prompt(answer.usage) > prompt(reply.usage)


def test_output_config_format_constrains_the_answer_to_its_schema(client, api_deployment):
    schema = {
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "blue"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["colour", "n"],
        "additionalProperties": False,
    }
    for seed_text in ("a", "b", "c"):
        reply = client.messages.create(
            model=api_deployment.model_name,
            messages=[{"role": "user", "content": f"Pick one ({seed_text})."}],
            max_tokens=60,
            output_config={"format": {"type": "json_schema", "schema": schema}},
        )
        value = json.loads(reply.content[0].text)
        assert value["colour"] in ("red", "blue") and 0 <= value["n"] <= 9


def test_errors_are_in_anthropics_shape_and_name_the_field(client, api_deployment):
    model = api_deployment.model_name
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": [image]}])
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0]" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=4, messages=TURNS)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.post("/v1/messages", body={"model": model, "messages": TURNS}, cast_to=object)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=api_deployment.api.base, api_key="wrong", max_retries=0).messages.create(
            model=model, max_tokens=4, messages=TURNS
        )
