"""Structured outputs and tool calls through the real API and deployment, driven by the official
`openai` client, on a tiny random model: the constraint, not the model, makes every output valid."""

from __future__ import annotations

import json
import re
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field
from transformers import AutoTokenizer

SEEDS = range(6)
MESSAGES = [{"role": "user", "content": "Describe a pet."}]


class Pet(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=30)
    kind: Literal["cat", "dog", "fish"]
    vaccinated: bool


class Weather(BaseModel):
    city: str = Field(max_length=10)
    days: int = Field(ge=1, le=7)


class Alarm(BaseModel):
    hour: int = Field(ge=0, le=23)
    label: Literal["work", "gym"]


@pytest.fixture(scope="module")
def client(api_deployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=api_deployment.api.base_url, api_key=api_deployment.api_key, max_retries=0)


def test_parse_with_a_pydantic_model_gives_a_valid_instance_for_every_seed(client, api_deployment):
    for seed in SEEDS:
        reply = client.chat.completions.parse(
            model=api_deployment.model_name,
            messages=MESSAGES,
            response_format=Pet,
            temperature=1.0,
            seed=seed,
            max_tokens=200,
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Pet)
        Pet.model_validate_json(choice.message.content)  # the text itself, not only what parse made of it


def test_json_schema_holds_for_each_of_n_forked_completions(client, api_deployment):
    reply = client.chat.completions.create(
        model=api_deployment.model_name,
        messages=MESSAGES,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "pet", "schema": Pet.model_json_schema()},
        },
        temperature=1.0,
        seed=11,
        n=3,
        max_tokens=200,
    )
    assert len(reply.choices) == 3
    for choice in reply.choices:
        Pet.model_validate_json(choice.message.content)


def test_vllm_guided_fields_constrain_completions_and_streams(client, api_deployment):
    for seed in SEEDS:
        out = client.completions.create(
            model=api_deployment.model_name,
            prompt="Pick:",
            max_tokens=20,
            temperature=1.0,
            seed=seed,
            extra_body={"guided_regex": "[a-c]{2}-[0-9]{3}"},
        )
        assert re.fullmatch("[a-c]{2}-[0-9]{3}", out.choices[0].text), out.choices[0].text
        chunks = client.chat.completions.create(
            model=api_deployment.model_name,
            messages=MESSAGES,
            max_tokens=20,
            temperature=1.0,
            seed=seed,
            stream=True,
            extra_body={"structured_outputs": {"choice": ["red", "green", "blue"]}},
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) in {
            "red",
            "green",
            "blue",
        }


def test_named_tool_choice_returns_arguments_matching_the_tools_schema(client, api_deployment):
    tools = [openai.pydantic_function_tool(Weather), openai.pydantic_function_tool(Alarm)]
    for seed in SEEDS:
        reply = client.chat.completions.parse(
            model=api_deployment.model_name,
            messages=[{"role": "user", "content": "Set an alarm."}],
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "Alarm"}},
            temperature=1.0,
            seed=seed,
            max_tokens=100,
        )
        (call,) = reply.choices[0].message.tool_calls
        assert call.function.name == "Alarm"
        assert isinstance(call.function.parsed_arguments, Alarm)
        assert reply.choices[0].finish_reason == "tool_calls"


def test_required_tool_choice_calls_one_of_the_tools_with_valid_arguments(client, api_deployment):
    tools = [openai.pydantic_function_tool(Weather), openai.pydantic_function_tool(Alarm)]
    models = {"Weather": Weather, "Alarm": Alarm}
    for seed in SEEDS:
        reply = client.chat.completions.create(
            model=api_deployment.model_name,
            messages=[{"role": "user", "content": "Help me."}],
            tools=tools,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            max_tokens=150,
        )
        calls = reply.choices[0].message.tool_calls
        assert len(calls) == 1, reply.choices[0]
        models[calls[0].function.name].model_validate_json(calls[0].function.arguments)


def test_streamed_named_tool_call_arrives_as_openai_tool_call_deltas(client, api_deployment):
    chunks = list(
        client.chat.completions.create(
            model=api_deployment.model_name,
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[openai.pydantic_function_tool(Weather)],
            tool_choice={"type": "function", "function": {"name": "Weather"}},
            temperature=0,
            max_tokens=100,
            stream=True,
        )
    )
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(deltas) > 1  # streamed, not one final blob
    first = deltas[0][0]
    assert first.id.startswith("call_") and first.function.name == "Weather"
    arguments = "".join(d[0].function.arguments or "" for d in deltas)
    Weather.model_validate_json(arguments)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # The same request unstreamed gives the same arguments (greedy).
    reply = client.chat.completions.create(
        model=api_deployment.model_name,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[openai.pydantic_function_tool(Weather)],
        tool_choice={"type": "function", "function": {"name": "Weather"}},
        temperature=0,
        max_tokens=100,
    )
    assert json.loads(reply.choices[0].message.tool_calls[0].function.arguments) == json.loads(arguments)


def test_logit_bias_of_plus_100_makes_greedy_take_that_token(client, api_deployment):
    out = client.completions.create(
        model=api_deployment.model_name, prompt="x", max_tokens=4, temperature=0, logit_bias={"70": 100}
    )
    token = AutoTokenizer.from_pretrained(str(api_deployment.model_path)).decode([70])
    assert out.choices[0].text == token * 4


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_regex": "(("}, "guided_regex"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objectx"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"structured_outputs": {"grammar": "root ::= missing"}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ],
)
def test_invalid_constraints_are_a_400_naming_the_field(client, api_deployment, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=api_deployment.model_name, messages=MESSAGES, max_tokens=4, extra_body=extra
        )
    assert info.value.body["param"] == param, info.value.body
