"""OpenAI request bodies -> our SamplingParams and prompts; refusals name OpenAI's field."""

from __future__ import annotations

import pytest

from pagedserve.services.api.errors import APIError
from pagedserve.services.api.sampling import Prompt, chat_sampling, completion_prompts, completion_sampling
from pagedserve.services.api.schemas import ChatCompletionRequest, CompletionRequest


def completion(**fields) -> CompletionRequest:
    return CompletionRequest(model="m", prompt=fields.pop("prompt", "hi"), **fields)


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def test_completion_fields_map_to_sampling_params_and_defaults_stay_ours():
    s = completion(max_tokens=7, temperature=0.5, top_p=0.9, n=2, seed=3, stop="END", logprobs=2, top_k=5)
    assert (s_ := completion_sampling(s)).max_tokens == 7 and s_.temperature == 0.5 and s_.top_p == 0.9
    assert (s_.n, s_.seed, s_.stop, s_.logprobs, s_.top_k) == (2, 3, ["END"], 2, 5)
    default = completion_sampling(completion())
    assert (default.max_tokens, default.temperature, default.logprobs) == (16, 1.0, None)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("text", [Prompt(text="text")]),
        (["a", "b"], [Prompt(text="a"), Prompt(text="b")]),
        ([5, 6], [Prompt(token_ids=[5, 6])]),
        ([[5], [6, 7]], [Prompt(token_ids=[5]), Prompt(token_ids=[6, 7])]),
    ],
)
def test_each_prompt_shape_becomes_one_prompt_per_entry(prompt, expected):
    assert completion_prompts(completion(prompt=prompt)) == expected


def test_an_empty_prompt_in_a_batch_is_named_by_its_index():
    with pytest.raises(APIError) as caught:
        completion_prompts(completion(prompt=["a", ""]))
    assert caught.value.status == 400 and "prompt[1]" in caught.value.message


def test_an_out_of_range_value_is_a_400_naming_the_field_and_limit():
    with pytest.raises(APIError) as caught:
        completion_sampling(completion(n=17))
    assert (caught.value.status, caught.value.param) == (400, "n")
    assert "16" in caught.value.message


def test_chat_limits_are_reported_under_openais_names():
    with pytest.raises(APIError) as caught:
        chat_sampling(chat(max_completion_tokens=0), 10, 512)
    assert caught.value.param == "max_completion_tokens"
    with pytest.raises(APIError) as caught:
        chat_sampling(chat(logprobs=True, top_logprobs=21), 10, 512)
    assert caught.value.param == "top_logprobs"


def test_chat_without_a_limit_may_fill_the_context():
    assert chat_sampling(chat(), 100, 512).max_tokens == 412
    assert chat_sampling(chat(max_tokens=5, max_completion_tokens=9), 100, 512).max_tokens == 9


def test_chat_logprobs_flag_and_top_logprobs_become_one_count():
    assert chat_sampling(chat(logprobs=True), 1, 512).logprobs == 0
    assert chat_sampling(chat(logprobs=True, top_logprobs=4), 1, 512).logprobs == 4
    assert chat_sampling(chat(), 1, 512).logprobs is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"structured_outputs": {"regex": "a", "json_object": True}}, "structured_outputs"),
        ({"logit_bias": {"one": 2.0}}, "logit_bias"),
        ({"logit_bias": {"1": 200.0}}, "logit_bias.1"),
    ],
)
def test_invalid_constraint_and_bias_fields_are_refused_naming_them(fields, param):
    with pytest.raises(APIError) as caught:
        chat_sampling(chat(**fields), 1, 512)
    assert caught.value.param == param, caught.value.message


def test_each_constraint_field_becomes_the_same_structured_outputs():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    by_format = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    for fields in ({"guided_json": schema}, {"structured_outputs": {"json": schema}}):
        assert (
            chat_sampling(chat(**fields), 1, 512).structured_outputs
            == chat_sampling(by_format, 1, 512).structured_outputs
        )
    assert chat_sampling(chat(guided_choice=["a", "b"]), 1, 512).structured_outputs.choice == ["a", "b"]
    assert chat_sampling(chat(response_format={"type": "json_object"}), 1, 512).structured_outputs.json_object
    assert chat_sampling(chat(logit_bias={"7": -5}), 1, 512).logit_bias == {7: -5.0}


def test_text_response_format_and_no_tools_are_fine():
    chat_sampling(chat(response_format={"type": "text"}, tool_choice="none"), 1, 512)


def test_completion_features_not_built_yet_are_refused():
    for fields, param in (
        ({"suffix": "x"}, "suffix"),
        ({"best_of": 3}, "best_of"),
    ):
        with pytest.raises(APIError) as caught:
            completion_sampling(completion(**fields))
        assert caught.value.param == param


def test_echo_with_logprobs_asks_for_the_prompts_logprobs_with_the_same_top_n():
    s = completion_sampling(completion(echo=True, logprobs=2, max_tokens=5))
    assert (s.logprobs, s.prompt_logprobs, s.max_tokens) == (2, 2, 5)
    assert completion_sampling(completion(logprobs=2)).prompt_logprobs is None  # no echo: the output's only
    assert completion_sampling(completion(echo=True)).prompt_logprobs is None  # no logprobs: text only


def test_echo_with_max_tokens_zero_samples_one_token_for_the_core():
    assert completion_sampling(completion(echo=True, logprobs=0, max_tokens=0)).max_tokens == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": 0},  # no echo: nothing to answer with
        {"echo": True, "logprobs": 21},
        {"echo": True, "logprobs": -1},
    ],
)
def test_echo_and_logprobs_limits_are_a_400_naming_the_field(fields):
    with pytest.raises(APIError) as caught:
        completion_sampling(completion(**fields))
    assert caught.value.status == 400 and caught.value.param == next(iter(f for f in fields if f != "echo"))
