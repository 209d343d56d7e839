"""A client that makes its own text (the SDK given the model's tokenizer, as the API runs it) gets what
the scheduler would have sent: the same text, token ids, finish reasons and streamed pieces, stop
strings across token boundaries and inside multi-byte characters included, with n > 1 and without
streaming; and a stop string it finds stops the scheduler early (StopAt), not at max_tokens, with
every block given back.

The tiny model's tokenizer is byte-level: a stop string always spans several tokens."""

from __future__ import annotations

import pytest
from harness.deployment import assert_no_leak, get_text, start

from pagedserve import Client
from pagedserve.services.checkpoint import load_tokenizer

PROMPT = [40, 41, 42, 43, 44, 45]
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def deployment(tiny_model, tmp_path_factory):
    model = tiny_model("llama")
    sup = start(model, workers=1, log_dir=tmp_path_factory.mktemp("client-text"))
    yield sup, load_tokenizer(model)
    sup.stop()


def run(client: Client, stream: bool, **kw):
    """(the result, the streamed tokens and text concatenated per completion)."""
    if not stream:
        return client.generate(**kw), None
    pieces: dict[int, tuple[list[int], str]] = {}
    s = client.stream(**kw)
    for delta in s:
        tokens, text = pieces.get(delta.index, ([], ""))
        pieces[delta.index] = (tokens + delta.token_ids, text + delta.text)
    return s.result, pieces


def same(a, b) -> None:
    (ra, sa), (rb, sb) = a, b
    assert [(o.index, o.token_ids, o.text, o.finish_reason) for o in ra.outputs] == [
        (o.index, o.token_ids, o.text, o.finish_reason) for o in rb.outputs
    ]
    assert ra.usage == rb.usage
    assert sa == sb


def generated(sup) -> float:
    for line in get_text(f"{sup.scheduler_ops_url}/metrics").splitlines():
        if line.startswith('pagedserve_tokens_total{kind="generated"}'):
            return float(line.split()[-1])
    return 0.0


def test_text_made_by_the_client_is_the_text_the_scheduler_makes(deployment):
    sup, tokenizer = deployment
    with (
        Client(sup.front_endpoint, timeout_s=60) as server_side,
        Client(sup.front_endpoint, timeout_s=60, tokenizer=tokenizer) as client_side,
    ):
        base = server_side.generate(prompt_token_ids=PROMPT, max_tokens=60, temperature=0.0, ignore_eos=True)
        assert len(base.text) > 20
        stops = [base.text[12:15], base.text[30:31] or "x"]  # spans bytes (tokens); maybe mid-character
        cases = [
            {"prompt_token_ids": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True},
            {"prompt": "hello there", "max_tokens": 40, "temperature": 0.0},
            {
                "prompt_token_ids": PROMPT,
                "stop": stops,
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "ignore_eos": True,
            },
            {
                "prompt_token_ids": PROMPT,
                "stop": stops,
                "include_stop_str_in_output": True,
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "ignore_eos": True,
                "logprobs": 2,
            },
            {
                "prompt_token_ids": PROMPT,
                "stop": ["\n", "e"],
                "n": 3,
                "seed": 7,
                "temperature": 1.0,
                "max_tokens": 80,
            },
        ]
        for kw in cases:
            for stream in (False, True):
                same(run(server_side, stream, **kw), run(client_side, stream, **kw))

        # The stop ends the request in the scheduler too, a few tokens after it, not at max_tokens.
        before = generated(sup)
        result = client_side.generate(**cases[2])
        assert result.finish_reason == "stop" and len(result.token_ids) < 20
        assert generated(sup) - before < MAX_TOKENS / 4
    # Completions ended by StopAt gave their blocks back like any other end.
    assert_no_leak(sup, expect_pools=1)
