"""LangChain's ChatOpenAI on the Responses API (`use_responses_api=True`) against a running pagedserve API.

    .venv-clients/bin/python ops/clients/langchain_responses.py --base-url http://127.0.0.1:8000/v1

Runs in the clients' venv (ops/clients/setup.sh). Prints `PASS name: ...` / `FAIL name: ...` per check;
exits with the failure count. Each check forces what it checks, so it holds for any model: a plain
invoke, a stream (chunks add up to the invoked text at temperature 0), a bound tool forced by
tool_choice, and with_structured_output (a JSON schema in text.format).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from functools import partial

from client_checks import parse_args, report
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field


class GetWeather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=32)


class City(BaseModel):
    name: str = Field(max_length=32)
    country: str = Field(max_length=32)


def plain(llm: ChatOpenAI) -> str:
    reply = llm.invoke("What is the capital of France?")
    assert reply.text and reply.response_metadata.get("id", "").startswith("resp"), reply
    return repr(reply.text)


def streamed(llm: ChatOpenAI) -> str:
    chunks = list(llm.stream("What is the capital of France?"))
    text = "".join(c.text for c in chunks)
    assert text == llm.invoke("What is the capital of France?").text, text
    return f"{len(chunks)} chunks: {text!r}"


def tool(llm: ChatOpenAI) -> str:
    reply = llm.bind_tools([GetWeather], tool_choice="GetWeather").invoke("What is the weather in Paris?")
    (call,) = reply.tool_calls
    assert call["name"] == "GetWeather" and isinstance(call["args"].get("city"), str), call
    return f"{call['name']} {call['args']}"


def structured(llm: ChatOpenAI) -> str:
    city = llm.with_structured_output(City, method="json_schema").invoke("Describe the capital of France.")
    assert isinstance(city, City), city
    return repr(city)


CHECKS: dict[str, Callable[[ChatOpenAI], str]] = {
    "invoke": plain,
    "stream": streamed,
    "bind_tools": tool,
    "with_structured_output": structured,
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, model="smollm2-135m")
    llm = ChatOpenAI(
        model=args.model, base_url=args.base_url, api_key=args.api_key, use_responses_api=True,
        temperature=0, max_tokens=48,
    )  # fmt: skip
    # The checks are synchronous calls: each runs in a thread, so the report is the async scripts' own.
    return asyncio.run(
        report({name: partial(asyncio.to_thread, check, llm) for name, check in CHECKS.items()})
    )


if __name__ == "__main__":
    sys.exit(main())
