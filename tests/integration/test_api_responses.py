"""POST /v1/responses driven by the official `openai` client against the shared deployment (a tiny
random Llama with a chat template): greedy output equal to chat completions' for the same turns,
streamed and not, previous_response_id, a function tool, text.format, and refusals naming the item."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import openai
import pytest
from harness.api_server import WEATHER_ARGUMENTS
from pydantic import BaseModel, Field

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": WEATHER_ARGUMENTS,
}


class Pet(BaseModel):
    name: str = Field(max_length=8)
    kind: Literal["cat", "dog"]
    age: int = Field(ge=0, le=20)


@pytest.fixture(scope="module")
def client(api_deployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=api_deployment.api.base_url, api_key=api_deployment.api_key, max_retries=0)


def chat_text(client, model, messages, max_tokens) -> tuple[str, int]:
    reply = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0
    )
    return reply.choices[0].message.content, reply.usage.prompt_tokens


def test_text_input_with_instructions_equals_the_chat_completion_of_the_same_turns(client, api_deployment):
    model = api_deployment.model_name
    reply = client.responses.create(
        model=model, input="Name a colour.", instructions="Be terse.", max_output_tokens=12, temperature=0
    )
    want, prompt_tokens = chat_text(
        client,
        model,
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a colour."}],
        12,
    )
    assert reply.object == "response" and reply.id.startswith("resp_")
    assert reply.status in ("completed", "incomplete") and reply.output_text == want
    assert reply.output[0].type == "message" and reply.output[0].content[0].type == "output_text"
    assert reply.usage.input_tokens == prompt_tokens and reply.usage.output_tokens <= 12
    if reply.status == "incomplete":
        assert reply.incomplete_details.reason == "max_output_tokens"
    assert client.responses.retrieve(reply.id).output_text == want


def test_streamed_events_follow_the_documented_sequence_and_add_up(client, api_deployment):
    kwargs = {
        "model": api_deployment.model_name,
        "input": "Tell me a story.",
        "max_output_tokens": 16,
        "temperature": 0,
    }
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if whole.status == "completed" else "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_previous_response_id_continues_the_conversation_without_its_instructions(client, api_deployment):
    model = api_deployment.model_name
    first = client.responses.create(
        model=model, input="Name a colour.", instructions="Be terse.", max_output_tokens=6, temperature=0
    )
    second = client.responses.create(
        model=model, input="Another?", previous_response_id=first.id, max_output_tokens=6, temperature=0
    )
    turns = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Another?"},
    ]
    want, prompt_tokens = chat_text(client, model, turns, 6)
    assert second.previous_response_id == first.id
    assert second.output_text == want and second.usage.input_tokens == prompt_tokens
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        client.responses.create(model=model, input="x", previous_response_id="resp_nope", max_output_tokens=2)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_a_function_tool_gives_a_function_call_item_and_takes_its_output(client, api_deployment):
    model = api_deployment.model_name
    reply = client.responses.create(
        model=model,
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_output_tokens=150,
        temperature=0,
    )
    calls = [item for item in reply.output if item.type == "function_call"]
    assert calls and all(c.name == "get_weather" and c.call_id for c in calls)
    arguments = json.loads(calls[0].arguments)
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("c", "f")
    streamed = list(
        client.responses.create(
            model=model,
            input="What is the weather in Paris?",
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=150,
            temperature=0,
            stream=True,
        )
    )
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    deltas = "".join(e.delta for e in streamed if e.type == "response.function_call_arguments.delta")
    assert len(done) == 1 and done[0].arguments == deltas and json.loads(deltas)["unit"] in ("c", "f")
    answer = client.responses.create(
        model=model,
        previous_response_id=reply.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temp": 21}'}],
        tools=[WEATHER_TOOL],
        max_output_tokens=8,
        temperature=0,
    )
    assert (
        answer.status in ("completed", "incomplete") and answer.usage.input_tokens > reply.usage.input_tokens
    )


def test_text_format_json_schema_is_parsed_into_the_model(client, api_deployment):
    for seed in range(3):
        reply = client.responses.parse(
            model=api_deployment.model_name,
            input="Describe a pet.",
            text_format=Pet,
            temperature=1.0,
            max_output_tokens=120,
            extra_body={"seed": seed},
        )
        assert reply.status == "completed", reply.output_text
        assert isinstance(reply.output_parsed, Pet)


def test_unsupported_items_and_tools_are_refused_by_name(client, api_deployment):
    model = api_deployment.model_name
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=model, input="x", tools=[{"type": "web_search"}])
    assert err.value.body["param"] == "tools[0]" and "web_search" in err.value.body["message"]
    image = {"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=model, input=[image])
    assert err.value.body["param"] == "input[0].content[0]"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=model, input="x", max_output_tokens=0)
    assert err.value.body["param"] == "max_output_tokens"
    reply = httpx.post(
        f"{api_deployment.api.base_url}/responses/resp_nope/cancel",
        headers={"Authorization": f"Bearer {api_deployment.api_key}"},
        timeout=10,
    )
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "response_not_found"
