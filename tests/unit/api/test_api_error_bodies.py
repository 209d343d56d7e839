"""The error body and the status of every scheduler code."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pagedserve.services.api.errors import APIError, as_api_errors, describe_validation, from_request_error
from pagedserve.services.api.schemas import CompletionRequest
from pagedserve.shared.sdk import RequestError


def test_the_body_has_openais_four_fields():
    body = APIError(400, "temperature: too low", "temperature", "invalid_value").body()
    assert body == {
        "error": {
            "message": "temperature: too low",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("invalid_request", 400),
        ("prompt_too_long", 400),
        ("max_tokens_too_large", 400),
        ("token_out_of_vocab", 400),
        ("too_many_requests", 429),
        ("overloaded", 429),
        ("no_workers", 503),
        ("timeout", 503),
        ("something_new", 500),
    ],
)
def test_scheduler_codes_map_to_statuses(code, status):
    error = from_request_error(RequestError(code, "why"))
    assert (error.status, error.code, error.message) == (status, code, "why")


def test_a_chat_prompt_error_names_messages():
    assert from_request_error(RequestError("prompt_too_long", "x"), "messages").param == "messages"


def test_unknown_fields_are_named_as_unknown():
    with pytest.raises(ValidationError) as caught:
        CompletionRequest(model="m", prompt="x", frobnicate=1)
    message, param = describe_validation(caught.value.errors(), drop_prefix=())
    assert param == "frobnicate" and "unknown field" in message


def test_sdk_errors_inside_the_block_become_api_errors():
    with pytest.raises(APIError) as caught, as_api_errors():
        raise RequestError("no_workers", "no worker registered")
    assert caught.value.status == 503
