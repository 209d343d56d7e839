"""StructuredOutputs.starts_after: a constraint that begins once the output holds a marker (the end of a
reasoning block), on the in-process engine with a tiny random Llama and its byte tokenizer.

logit_bias steers the random model: a bias on the marker makes it the first token (then the grammar
must rule, though the bias still pulls towards the marker); without the marker the output stays free."""

from __future__ import annotations

import re

import pytest

from pagedserve import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    return LLM(str(tiny_model("llama")), num_blocks=64, block_size=8)


def token_of(llm: LLM, char: str) -> int:
    (token,) = llm.encode(char)
    return token


def run(llm: LLM, bias: dict[int, float], **constraint) -> str:
    params = SamplingParams(
        temperature=0,
        max_tokens=12,
        logit_bias=bias,
        structured_outputs={"regex": "[0-9]{3,6}", **constraint},
    )
    return llm.generate([llm.encode("think first")], params)[0].text


def test_the_grammar_rules_only_after_the_marker(llm):
    marker = token_of(llm, "Z")
    text = run(llm, {marker: 100.0}, starts_after=[marker])
    assert text.startswith("Z")
    assert re.fullmatch(r"[0-9]{3,6}", text[1:]), text


def test_without_the_marker_the_output_is_free(llm):
    marker, free = token_of(llm, "Z"), token_of(llm, "x")
    text = run(llm, {free: 100.0}, starts_after=[marker])
    assert text == "x" * 12  # never constrained: the regex would allow no "x"


def test_a_marker_of_two_tokens_starts_the_grammar_only_when_whole(llm):
    z = token_of(llm, "Z")
    text = run(llm, {z: 100.0}, starts_after=[z, z])
    assert text.startswith("ZZ") and re.fullmatch(r"[0-9]{3,6}", text[2:]), text
