"""The reasoning parsers (qwen3, deepseek_r1): the thinking block apart from the answer, whatever pieces
the text streams in, and tool calls read from the answer only."""

from __future__ import annotations

import pytest

from pagedserve.services.api.output_reader import OutputReader, read_whole
from pagedserve.services.api.reasoning import ReasoningSplitter, split_reasoning, think_state
from pagedserve.services.api.tools import ToolMode


def streamed(parser: str, state: str, text: str, size: int) -> tuple[str, str]:
    splitter = ReasoningSplitter(parser, state)  # type: ignore[arg-type]
    reasoning = answer = ""
    for at in range(0, len(text), size):
        r, a = splitter.feed(text[at : at + size])
        reasoning, answer = reasoning + r, answer + a
    r, a = splitter.finish()
    return reasoning + r, answer + a


CASES = [
    # parser, how the prompt left <think>, output -> (reasoning, answer)
    ("qwen3", "none", "<think>\nLet me see.\n</think>\n\nParis.", ("\nLet me see.\n", "Paris.")),
    ("qwen3", "none", "Paris, no thinking.", (None, "Paris, no thinking.")),
    ("qwen3", "closed", "Paris <think> is literal here", (None, "Paris <think> is literal here")),
    ("qwen3", "open", "still thinking</think>Paris.", ("still thinking", "Paris.")),
    ("qwen3", "none", "<think>cut short by max_tokens", ("cut short by max_tokens", "")),
    ("deepseek_r1", "none", "opened in the prompt</think>\n\nParis.", ("opened in the prompt", "Paris.")),
    ("deepseek_r1", "none", "<think>x</think>y", ("x", "y")),
    ("qwen3", "none", "<thin", (None, "<thin")),  # looked like the tag, was not
]


@pytest.mark.parametrize(("parser", "state", "text", "expected"), CASES)
def test_split_whole_and_in_any_pieces(parser, state, text, expected):
    reasoning, answer = split_reasoning(parser, state, text)
    assert (reasoning, answer) == expected
    for size in (1, 2, 3, 5, len(text)):
        got = streamed(parser, state, text, size)
        assert got == ((expected[0] or ""), expected[1]), size


def test_the_prompts_last_turn_says_where_thinking_stands():
    assert think_state("<|im_start|>assistant\n") == "none"
    assert think_state("<|im_start|>assistant\n<think>\n\n</think>\n\n") == "closed"
    assert think_state("<|Assistant|><think>\n") == "open"


def test_tool_calls_are_read_from_the_answer_not_the_thinking():
    text = '<think>maybe <tool_call>{"name": "no", "arguments": {}}</tool_call></think>ok <tool_call>{"name": "yes", "arguments": {"a": 1}}</tool_call>'
    reasoning, answer, calls = read_whole(text, ToolMode("auto"), "hermes", "qwen3", "none")
    assert reasoning is not None and "no" in reasoning
    assert answer == "ok " and [(n, a) for _, n, a in calls] == [("yes", '{"a": 1}')]
    reader = OutputReader(ToolMode("named", "f"), "hermes", "qwen3", "none")
    pieces = reader.feed("<think>plan</think>") + reader.feed('{"a": 1}') + reader.finish()
    assert [(p.kind, p.text) for p in pieces] == [("reasoning", "plan"), ("call", '{"a": 1}')]
    assert pieces[1].name == "f" and reader.num_calls == 1
