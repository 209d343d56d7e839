"""A mixture-of-experts model through the real deployment and the OpenAI API: a tiny Qwen3-MoE served
quantized from the GGUF the test writes (one worker, the API in front, the official `openai` client).
The path is the Llama family's: chat template, greedy completions equal to the in-process engine's,
structured outputs, the prefix cache."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from harness.api_server import ApiServer, with_chat_template
from harness.deployment import start
from harness.gguf_models import quantize_checkpoint
from pydantic import BaseModel, Field

from pagedserve import LLM, SamplingParams
from pagedserve.ops.deploy.json_logs import log_events

API_KEY = "moe-key"


class Pet(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=30)


@pytest.fixture(scope="module")
def moe_api(tiny_model, tmp_path_factory) -> Iterator[tuple[openai.OpenAI, object, str]]:
    folder = tmp_path_factory.mktemp("moe-api") / "tiny-moe"
    shutil.copytree(tiny_model("qwen3_moe"), folder)
    quantize_checkpoint(folder, "Q8_0")
    with_chat_template(folder)
    logs = tmp_path_factory.mktemp("moe-api-logs")
    sup = start(folder, workers=1, log_dir=logs, quantization="gguf")
    api = ApiServer(sup.config, logs / "api.log", "--api-key", API_KEY)
    try:
        api.wait_healthy()
        client = openai.OpenAI(base_url=api.base_url, api_key=API_KEY, max_retries=0)
        yield client, sup, str(folder), logs
    finally:
        api.stop()
        sup.stop()


def test_greedy_completions_equal_the_in_process_engine(moe_api):
    client, _sup, folder, _logs = moe_api
    prompts = ["The quick brown fox", "MoE: one router, many experts"]
    expected = LLM(folder, num_blocks=128, quantization="gguf").generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    )
    for prompt, want in zip(prompts, expected, strict=True):
        out = client.completions.create(
            model="tiny-moe", prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
        assert out.choices[0].text == want.text


def test_json_schema_holds_through_the_chat_template(moe_api):
    client, _sup, _folder, _logs = moe_api
    for seed in range(3):
        reply = client.chat.completions.parse(
            model="tiny-moe",
            messages=[{"role": "user", "content": "Describe a pet."}],
            response_format=Pet,
            temperature=1.0,
            seed=seed,
            max_tokens=120,
        )
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        assert isinstance(reply.choices[0].message.parsed, Pet)


def test_a_repeated_long_prompt_is_served_from_the_prefix_cache(moe_api):
    client, _sup, _folder, _logs = moe_api
    prompt = "a shared system prompt long enough to fill several blocks " * 3  # 177 byte tokens
    first = client.completions.create(model="tiny-moe", prompt=prompt + "one", max_tokens=4, temperature=0)
    second = client.completions.create(model="tiny-moe", prompt=prompt + "two", max_tokens=4, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= 160  # every full block of the shared part


def test_the_workers_start_log_says_what_its_runtime_and_its_weights_hold(moe_api):
    """`memory` on worker_started: resident MiB before the model loads (the runtime) and after (the
    weights added), which the RSS figures of docs/benchmarks.md are read against."""
    _client, _sup, folder, logs = moe_api
    memory = log_events(logs / "worker-0.log", "worker_started")[0]["memory"]
    gguf_mib = sum(f.stat().st_size for f in Path(folder).glob("*.gguf")) / 2**20
    assert memory["rss_before_load_mib"] > 100  # an interpreter with torch imported (~240 MiB here)
    # The tiny model's packed blocks are a copy of the file's: loaded, the worker holds at least that.
    assert memory["rss_loaded_mib"] - memory["rss_before_load_mib"] >= 0.9 * gguf_mib
