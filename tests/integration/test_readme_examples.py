"""The Python examples of README.md and docs/usage.md run as written against a live deployment: the
openai client, the ZeroMQ SDK (sync and async) and the in-process `LLM`. They are read from the pages
themselves, so an example that drifts from the code fails here. Only the addresses, the model and the key change: the
README's are the defaults of `pagedserve up` with the bundled model; this deployment has its own."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = (README, ROOT / "docs" / "usage.md")


def python_blocks() -> dict[str, str]:
    """The pages' ```python blocks, by the name each opens with (its first import)."""
    text = "\n".join(page.read_text() for page in PAGES)
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)
    named = {}
    for block in blocks:
        first = next(line for line in block.splitlines() if line.startswith(("from ", "import ")))
        named[first] = block
    return named


def run_block(source: str, replacements: dict[str, str]) -> str:
    """Run one example (top-level `async with` / `await` allowed, as in an asyncio REPL) -> its stdout."""
    for old, new in replacements.items():
        assert old in source, f"the README example no longer holds {old!r}"
        source = source.replace(old, new)
    # dont_inherit: run it as a reader would, not under this module's `from __future__ import annotations`
    # (string annotations that pydantic cannot resolve in a namespace no module holds).
    code = compile(source, str(README), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        pending = eval(code, {"__name__": "readme_example"})  # a coroutine when the block awaits
        if pending is not None:
            asyncio.run(pending)
    return out.getvalue()


@pytest.fixture(scope="module")
def blocks() -> dict[str, str]:
    found = python_blocks()
    assert set(found) == {
        "from openai import OpenAI",
        "from pagedserve import Client, AsyncClient",
        "from pagedserve import LLM, SamplingParams",
        "from pagedserve import LLM, SamplingParams, Client",  # the README's own: both in five lines
        "from typing import Literal",  # structured output and a tool call through the openai client
        "import openai",  # echo with logprobs: the prompt's own token logprobs
    }, sorted(found)
    return found


def openai_client_at(api_deployment) -> dict[str, str]:
    """The README's openai-client examples pointed at this deployment: URL, key and model name."""
    return {
        '"http://127.0.0.1:8000/v1"': repr(api_deployment.api.base_url),
        'api_key="unused"': f"api_key={api_deployment.api_key!r}",
        'model="smollm2-135m"': f"model={api_deployment.model_name!r}",
    }


def test_the_openai_client_example_runs(blocks, api_deployment) -> None:
    out = run_block(
        blocks["from openai import OpenAI"],
        openai_client_at(api_deployment),
    )
    assert "prompt_tokens=" in out and "completion_tokens=" in out  # print(reply.usage)


def test_the_structured_output_and_tool_call_example_runs(blocks, api_deployment) -> None:
    out = run_block(
        blocks["from typing import Literal"],
        {
            **openai_client_at(api_deployment),
            # A random tiny model's tokens are short: room to close the 32-character strings.
            "max_tokens=100": "max_tokens=400",
        },
    )
    # Whatever the (tiny, random) model says, the constraint makes it a City and a GetWeather call.
    lines = out.splitlines()
    assert lines[0].startswith("City(name="), out
    name, _, rest = lines[-1].partition(" ")
    arguments, _, finish_reason = rest.rpartition(" ")
    assert (name, finish_reason) == ("GetWeather", "tool_calls"), out
    call = json.loads(arguments)
    assert set(call) == {"city", "unit"} and call["unit"] in ("celsius", "fahrenheit"), out


def test_the_prompt_logprobs_example_runs(blocks, api_deployment) -> None:
    out = run_block(
        blocks["import openai"],
        {
            **openai_client_at(api_deployment),
        },
    )
    lines = out.splitlines()
    prompt = "The capital of France is Paris"
    assert len(lines) == len(prompt) + 1, out  # one byte a token in the tiny tokenizer, then the sum
    assert lines[0] == "'T' None None", out  # the first token has no logprob
    assert lines[-1].endswith(f"{list(range(len(prompt)))} 0"), out  # offsets; nothing generated


def test_the_sdk_example_runs(blocks, api_deployment) -> None:
    out = run_block(
        blocks["from pagedserve import Client, AsyncClient"],
        {'"tcp://127.0.0.1:5555"': repr(api_deployment.sup.config.front_endpoint)},
    )
    # print(r.text, r.finish_reason, r.usage.completion_tokens) on a 32-token request
    assert re.search(r"(length|stop) \d+\n", out), out


def test_the_in_process_example_runs(blocks, api_deployment) -> None:
    out = run_block(
        blocks["from pagedserve import LLM, SamplingParams"],
        {'model="smollm2-135m"': f"model={str(api_deployment.model_path)!r}"},
    )
    assert out.rstrip().endswith(("length", "stop")), out


def test_the_readme_front_page_example_runs(blocks, api_deployment) -> None:
    out = run_block(
        blocks["from pagedserve import LLM, SamplingParams, Client"],
        {
            'model="smollm2-135m"': f"model={str(api_deployment.model_path)!r}",
            '"tcp://127.0.0.1:5555"': repr(api_deployment.sup.config.front_endpoint),
        },
    )
    assert out.count("\n") >= 2, out  # the in-process answer, then the deployment's
