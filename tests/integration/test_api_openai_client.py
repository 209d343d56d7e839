"""The HTTP API driven by the official `openai` client (sync and async, streamed and not), checked
against the SDK's own greedy outputs for the same token ids."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from pagedserve import Client

PROMPT = "The quick brown fox"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another?"},
]


@pytest.fixture(scope="module")
def client(api_deployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=api_deployment.api.base_url, api_key=api_deployment.api_key, max_retries=0)


@pytest.fixture(scope="module")
def aclient_args(api_deployment) -> dict:
    return {"base_url": api_deployment.api.base_url, "api_key": api_deployment.api_key, "max_retries": 0}


@pytest.fixture(scope="module")
def sdk(api_deployment):
    with Client(api_deployment.sup.front_endpoint, timeout_s=60) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer(api_deployment):
    return AutoTokenizer.from_pretrained(str(api_deployment.model_path))


def chat_token_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def test_models_lists_the_served_model_under_its_folder_name(client, api_deployment):
    models = client.models.list().data
    assert [m.id for m in models] == [api_deployment.model_name]
    assert client.models.retrieve(api_deployment.model_name).id == api_deployment.model_name


def test_greedy_completion_equals_the_sdks_greedy_output_for_the_same_token_ids(
    client, sdk, tokenizer, api_deployment
):
    ids = tokenizer.encode(PROMPT)
    for prompt in (PROMPT, ids):
        reply = client.completions.create(
            model=api_deployment.model_name, prompt=prompt, max_tokens=12, temperature=0
        )
        expected = sdk.generate(prompt_token_ids=ids, max_tokens=12, temperature=0.0)
        assert reply.choices[0].text == expected.text
        assert reply.choices[0].finish_reason == expected.finish_reason
        assert reply.id.startswith("cmpl-") and reply.object == "text_completion"


def test_greedy_chat_equals_the_sdks_greedy_output_for_the_rendered_template(
    client, sdk, tokenizer, api_deployment
):
    reply = client.chat.completions.create(
        model=api_deployment.model_name, messages=MESSAGES, max_tokens=10, temperature=0
    )
    ids = chat_token_ids(tokenizer, MESSAGES)
    expected = sdk.generate(prompt_token_ids=ids, max_tokens=10, temperature=0.0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert reply.id.startswith("chatcmpl-") and reply.object == "chat.completion"
    assert reply.usage.prompt_tokens == len(ids)
    # max_completion_tokens is the newer name of the same limit
    again = client.chat.completions.create(
        model=api_deployment.model_name, messages=MESSAGES, max_completion_tokens=10, temperature=0
    )
    assert again.choices[0].message.content == expected.text


def test_usage_counts_prompt_and_completion_tokens(client, api_deployment):
    reply = client.completions.create(
        model=api_deployment.model_name,
        prompt=PROMPT,
        max_tokens=7,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert reply.choices[0].finish_reason == "length"
    # the byte tokenizer: one token per byte, no BOS
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(PROMPT.encode()), 7)
    assert reply.usage.total_tokens == len(PROMPT.encode()) + 7


def test_streamed_completion_deltas_concatenate_to_the_non_streamed_text(client, api_deployment):
    kwargs = {"model": api_deployment.model_name, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(PROMPT.encode())
    assert all(c.usage is None for c in chunks[:-1])


def test_async_streamed_chat_starts_with_the_role_and_concatenates_to_the_non_streamed_text(
    aclient_args, api_deployment
):
    async def run() -> tuple[str, list]:
        async with openai.AsyncOpenAI(**aclient_args) as aclient:
            kwargs = {
                "model": api_deployment.model_name,
                "messages": MESSAGES,
                "max_tokens": 16,
                "temperature": 0,
            }
            whole = await aclient.chat.completions.create(**kwargs)
            stream = await aclient.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, **kwargs
            )
            chunks = [c async for c in stream]
            return whole.choices[0].message.content, chunks, whole.usage

    whole, chunks, usage = asyncio.run(run())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"] or finals == ["stop"]
    assert chunks[-1].usage.completion_tokens == usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == usage.prompt_tokens


def test_async_completions_run_concurrently_and_each_matches_its_own_greedy_output(
    aclient_args, sdk, api_deployment
):
    prompts = [f"Prompt number {i}: " for i in range(6)]

    async def run() -> list[str]:
        async with openai.AsyncOpenAI(**aclient_args) as aclient:
            replies = await asyncio.gather(
                *(
                    aclient.completions.create(
                        model=api_deployment.model_name, prompt=p, max_tokens=8, temperature=0
                    )
                    for p in prompts
                )
            )
            return [r.choices[0].text for r in replies]

    got = asyncio.run(run())
    assert got == [sdk.generate(p, max_tokens=8, temperature=0.0).text for p in prompts]


def test_n2_with_a_seed_gives_two_choices_and_the_same_two_again(client, api_deployment):
    kwargs = {
        "model": api_deployment.model_name,
        "messages": MESSAGES,
        "max_tokens": 12,
        "temperature": 1.0,
        "n": 2,
        "seed": 1234,
    }
    first = client.chat.completions.create(**kwargs)
    second = client.chat.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in second.choices]
    assert first.choices[0].message.content != first.choices[1].message.content
    # each choice counts its own tokens: 2 x 12 unless one met EOS first
    lengths = [12 if c.finish_reason == "length" else None for c in first.choices]
    if None not in lengths:
        assert first.usage.completion_tokens == 24


def test_a_batch_of_prompts_gets_n_choices_per_prompt_in_order(client, sdk, api_deployment):
    prompts = ["First prompt", "Second prompt"]
    reply = client.completions.create(
        model=api_deployment.model_name, prompt=prompts, max_tokens=6, temperature=0, n=2
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    expected = [sdk.generate(p, max_tokens=6, temperature=0.0).text for p in prompts]
    assert [c.text for c in reply.choices] == [expected[0], expected[0], expected[1], expected[1]]
    assert reply.usage.prompt_tokens == sum(len(p.encode()) for p in prompts)


def test_chat_logprobs_name_each_token_and_its_top_alternatives(client, api_deployment):
    reply = client.chat.completions.create(
        model=api_deployment.model_name,
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 8 or reply.choices[0].finish_reason == "stop"
    for entry in content:
        tops = entry.top_logprobs
        assert len(tops) == 3
        assert [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        assert entry.logprob <= 0
        # greedy: the sampled token is the most likely one
        assert entry.token == tops[0].token and entry.logprob == pytest.approx(tops[0].logprob)
        assert entry.bytes == tops[0].bytes
        assert len(entry.bytes) <= 1  # the byte tokenizer (ids past its 259 tokens read as nothing)
    assert (
        b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace")
        == reply.choices[0].message.content
    )


def test_completion_logprobs_use_the_legacy_parallel_lists(client, api_deployment):
    reply = client.completions.create(
        model=api_deployment.model_name, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2
    )
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert len(lp.tokens) == reply.usage.completion_tokens
    for token, logprob, tops in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(tops) <= 2 and max(tops.values()) == pytest.approx(logprob)
        assert token in tops
    assert lp.text_offset == sorted(lp.text_offset)


def test_a_stop_string_ends_the_text_before_it(client, api_deployment):
    kwargs = {"model": api_deployment.model_name, "prompt": PROMPT, "temperature": 0}
    whole = (
        client.completions.create(max_tokens=24, extra_body={"ignore_eos": True}, **kwargs).choices[0].text
    )
    stop = next(whole[i : i + 2] for i in range(3, len(whole) - 2) if whole[i : i + 2].isprintable())
    reply = client.completions.create(max_tokens=24, stop=[stop], extra_body={"ignore_eos": True}, **kwargs)
    assert reply.choices[0].text == whole[: whole.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


def test_echo_puts_the_prompt_before_the_completion(client, api_deployment):
    kwargs = {"model": api_deployment.model_name, "prompt": PROMPT, "max_tokens": 5, "temperature": 0}
    plain = client.completions.create(**kwargs).choices[0].text
    echoed = client.completions.create(echo=True, **kwargs).choices[0].text
    assert echoed == PROMPT + plain


def test_x_request_id_is_echoed_and_names_the_response(api_deployment):
    reply = httpx.post(
        f"{api_deployment.api.base_url}/completions",
        headers={"Authorization": f"Bearer {api_deployment.api_key}", "X-Request-Id": "my-trace-42"},
        json={"model": api_deployment.model_name, "prompt": PROMPT, "max_tokens": 2},
        timeout=30,
    )
    assert reply.status_code == 200
    assert reply.headers["x-request-id"] == "my-trace-42"
    assert reply.json()["id"] == "cmpl-my-trace-42"
    # a second request under the same id is a new request, not the stored first one
    again = httpx.post(
        f"{api_deployment.api.base_url}/completions",
        headers={"Authorization": f"Bearer {api_deployment.api_key}", "X-Request-Id": "my-trace-42"},
        json={
            "model": api_deployment.model_name,
            "prompt": "Something else",
            "max_tokens": 2,
            "temperature": 0,
        },
        timeout=30,
    )
    assert again.status_code == 200 and again.json()["usage"]["prompt_tokens"] == len(b"Something else")


def test_metrics_count_requests_by_route_and_status(api_deployment, client):
    client.models.list()
    text = httpx.get(f"{api_deployment.api.base}/metrics", timeout=10).text
    assert 'pagedserve_api_requests_total{route="/v1/models",status="200"}' in text
    assert "pagedserve_api_request_seconds_bucket" in text
    assert "pagedserve_api_requests_in_flight" in text
