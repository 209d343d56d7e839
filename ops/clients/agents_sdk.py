"""The OpenAI Agents SDK driving a running pagedserve API on its default path, the Responses API.

    .venv-clients/bin/python ops/clients/agents_sdk.py --base-url http://127.0.0.1:8000/v1

Runs in the clients' venv (ops/clients/setup.sh), never the project's: it imports only the SDK.
Each check prints one line `PASS name: detail` or `FAIL name: reason`; the exit status is the number
of failures. The checks force what they check (a tool call by tool_choice, JSON by the schema); the plain ones ask
what the bundled model answers in a few tokens, because the SDK takes a response cut by
max_output_tokens (status incomplete, as OpenAI's) for an error:
- a plain run and a streamed run (the SDK's stream events, text deltas joined to the final output);
- a function tool forced by `tool_choice`: the SDK calls the Python function with the model's
  arguments and feeds the result back (a function_call_output item) for the final answer;
- `output_type` (a pydantic model): the SDK sends text.format json_schema and parses the answer;
- `previous_response_id`: a second run continues the first's stored response.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from functools import partial

from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from client_checks import parse_args, report
from openai import AsyncOpenAI
from pydantic import BaseModel

CALLS: list[str] = []
QUESTION = "What is the capital of France?"
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"  # its template's own
SHORT = ModelSettings(max_tokens=64, temperature=0)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    CALLS.append(city)
    return f"It is sunny in {city}."


class City(BaseModel):
    name: str
    population: int


async def plain(model: str) -> str:
    agent = Agent(name="plain", instructions=SYSTEM, model=model, model_settings=SHORT)
    result = await Runner.run(agent, QUESTION)
    assert isinstance(result.final_output, str) and result.final_output, result.final_output
    assert result.last_response_id and result.last_response_id.startswith("resp"), result.last_response_id
    return f"{result.final_output!r} ({result.last_response_id})"


async def streamed(model: str) -> str:
    agent = Agent(name="streamed", model=model, model_settings=SHORT)
    run = Runner.run_streamed(agent, QUESTION)
    deltas, kinds = [], set()
    async for event in run.stream_events():
        kinds.add(event.type)
        data = getattr(event, "data", None)
        if event.type == "raw_response_event" and getattr(data, "type", "") == "response.output_text.delta":
            deltas.append(data.delta)
    assert "".join(deltas) == run.final_output, ("".join(deltas), run.final_output)
    assert run.final_output, "no text"
    return f"{len(deltas)} deltas, events {sorted(kinds)}"


async def tool(model: str) -> str:
    CALLS.clear()
    agent = Agent(
        name="tools", instructions="Use the tool.", model=model, tools=[get_weather],
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=64, temperature=0),
    )  # fmt: skip
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
    kinds = [item.type for item in result.new_items]
    assert CALLS, f"the tool was never called: {kinds}"
    assert "tool_call_output_item" in kinds and kinds[-1] == "message_output_item", kinds
    return f"called get_weather({CALLS[0]!r}); items {kinds}; answer {result.final_output!r}"


async def structured(model: str) -> str:
    agent = Agent(name="structured", model=model, output_type=City,
                  model_settings=ModelSettings(max_tokens=96, temperature=0))  # fmt: skip
    result = await Runner.run(agent, "Name a city and its population.")
    assert isinstance(result.final_output, City), type(result.final_output)
    return repr(result.final_output)


async def continued(model: str) -> str:
    agent = Agent(name="continued", model=model, model_settings=SHORT)
    first = await Runner.run(agent, QUESTION)
    second = await Runner.run(agent, "And of Germany?", previous_response_id=first.last_response_id)
    assert second.last_response_id != first.last_response_id
    return f"{first.last_response_id} -> {second.last_response_id}: {second.final_output!r}"


CHECKS: dict[str, Callable[[str], Awaitable[str]]] = {
    "plain": plain,
    "streamed": streamed,
    "function_tool": tool,
    "output_type": structured,
    "previous_response_id": continued,
}


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, model=None)
    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key)
    set_default_openai_client(client, use_for_tracing=False)
    set_default_openai_api("responses")  # the SDK's default, said out loud
    set_tracing_disabled(True)
    model = args.model or (await client.models.list()).data[0].id
    return await report({name: partial(check, model) for name, check in CHECKS.items()})


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
