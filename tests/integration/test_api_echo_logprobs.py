"""`echo` with `logprobs` on /v1/completions through the real API and deployment, with the official
`openai` client, as lm-eval's loglikelihood requests send it (max_tokens 0 or 1, logprobs 0..5).

The prompt's logprobs must be transformers' log_softmax of the same tiny model's logits (float32),
in OpenAI's legacy shape: the prompt's tokens first, the first one's logprob and top list null, and
text offsets counting on through the completion.
"""

from __future__ import annotations

import openai
import pytest
import torch

PROMPT = "The quick brown fox jumps over the lazy dog, then naps in the sun."  # > 3 blocks of 16 bytes


@pytest.fixture(scope="module")
def client(api_deployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=api_deployment.api.base_url, api_key=api_deployment.api_key, max_retries=0)


@pytest.fixture(scope="module")
def reference(api_deployment) -> tuple[list[int], torch.Tensor]:
    """The prompt's token ids and transformers' log_softmax at each of its positions, [P, vocab]."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(api_deployment.model_path)).encode(PROMPT)
    model = AutoModelForCausalLM.from_pretrained(api_deployment.model_path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return ids, model(torch.tensor([ids])).logits[0].log_softmax(dim=-1)


def echo(client, api_deployment, **fields):
    return client.completions.create(
        model=api_deployment.model_name, prompt=PROMPT, echo=True, temperature=0, **fields
    )


def assert_prompt_part(logprobs, reference, top: int) -> None:
    ids, expected = reference
    p = len(ids)
    assert "".join(logprobs.tokens[:p]) == PROMPT  # one token per byte in the tiny tokenizer
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    want = expected[:-1].gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(torch.tensor(logprobs.token_logprobs[1:p]), want, atol=1e-4, rtol=0)
    best = expected[:-1].max(dim=-1).values
    for position, tops in enumerate(logprobs.top_logprobs[1:p]):
        # Keyed by token text, as OpenAI's shape is: ids past the tokenizer's all read "" and merge.
        assert len(tops) <= top and (len(tops) > 0) == (top > 0)
        if tops:
            assert abs(max(tops.values()) - best[position].item()) < 1e-4
    assert logprobs.text_offset[:p] == list(range(p))


def test_max_tokens_zero_returns_the_prompt_and_its_logprobs_alone(client, api_deployment, reference):
    reply = echo(client, api_deployment, max_tokens=0, logprobs=5)
    (choice,) = reply.choices
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == len(reference[0])
    assert_prompt_part(choice.logprobs, reference, top=5)
    assert reply.usage.completion_tokens == 0 and reply.usage.prompt_tokens == len(reference[0])


def test_max_tokens_one_appends_the_completions_token_after_the_prompts(client, api_deployment, reference):
    reply = echo(client, api_deployment, max_tokens=1, logprobs=0)
    (choice,) = reply.choices
    p = len(reference[0])
    assert choice.text.startswith(PROMPT) and len(choice.logprobs.tokens) == p + 1
    assert_prompt_part(choice.logprobs, reference, top=0)
    assert choice.logprobs.token_logprobs[p] <= 0.0 and choice.logprobs.text_offset[p] == p
    assert choice.text == PROMPT + choice.logprobs.tokens[p]


def test_streamed_echo_with_logprobs_joins_to_the_unstreamed_answer(client, api_deployment, reference):
    whole = echo(client, api_deployment, max_tokens=4, logprobs=2).choices[0]
    chunks = [
        c.choices[0] for c in echo(client, api_deployment, max_tokens=4, logprobs=2, stream=True) if c.choices
    ]
    assert chunks[0].text == PROMPT  # the echo goes first, with the prompt's logprobs
    assert_prompt_part(chunks[0].logprobs, reference, top=2)
    parts = [c.logprobs for c in chunks if c.logprobs is not None]
    assert "".join(c.text for c in chunks) == whole.text
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for part in parts for x in getattr(part, key)] == getattr(whole.logprobs, key), key
    assert chunks[-1].finish_reason == whole.finish_reason


def test_streamed_max_tokens_zero_sends_only_the_prompt(client, api_deployment, reference):
    chunks = [
        c.choices[0] for c in echo(client, api_deployment, max_tokens=0, logprobs=1, stream=True) if c.choices
    ]
    assert "".join(c.text for c in chunks) == PROMPT
    assert chunks[-1].finish_reason == "length"
    assert_prompt_part(chunks[0].logprobs, reference, top=1)


def test_a_prefix_cached_prompt_still_gets_all_its_logprobs(client, api_deployment, reference):
    for _ in range(2):  # the second one hits the cache the first filled
        plain = client.completions.create(model=api_deployment.model_name, prompt=PROMPT, max_tokens=1)
    assert plain.usage.prompt_tokens_details.cached_tokens > 0
    reply = echo(client, api_deployment, max_tokens=0, logprobs=1)
    assert reply.usage.prompt_tokens_details.cached_tokens == 0  # computed whole, for the logprobs
    assert_prompt_part(reply.choices[0].logprobs, reference, top=1)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"echo": True, "logprobs": 21}, "logprobs"),  # past the top-n limit (20, as for outputs)
        ({"echo": True, "logprobs": -1}, "logprobs"),
        ({"max_tokens": 0}, "max_tokens"),  # without echo there is nothing to answer with
    ],
)
def test_echo_logprobs_limits_are_a_400_naming_the_field(client, api_deployment, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=api_deployment.model_name, prompt=PROMPT, **fields)
    assert info.value.body["param"] == param, info.value.body
