"""The Hermes/Qwen tool-call parser (tool_choice auto) and the streamed tool-call deltas."""

from __future__ import annotations

import json

from pagedserve.services.api.choices import chat_message
from pagedserve.services.api.tool_parsers import HermesParser
from pagedserve.services.api.tool_stream import ChoiceToolStream
from pagedserve.services.api.tools import ToolMode

TEXT = (
    'Let me check. <tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'
    '<tool_call>\n{"name": "time", "arguments": {}}\n</tool_call> done'
)


def test_calls_are_read_out_of_the_text_and_the_rest_is_content():
    content, calls, _ = chat_message(TEXT, ToolMode("auto"), "hermes")
    assert content == "Let me check.  done"
    assert [c["function"]["name"] for c in calls] == ["weather", "time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)


def test_text_fed_in_any_pieces_gives_the_same_content_and_calls():
    for size in (1, 3, 7, len(TEXT)):
        parser = HermesParser()
        content = ""
        for at in range(0, len(TEXT), size):
            piece, _ = parser.feed(TEXT[at : at + size])
            content += piece
        content += parser.finish()
        assert content == "Let me check.  done"
        assert [c.name for c in parser.calls] == ["weather", "time"]


def test_a_block_that_is_not_a_call_stays_content_and_an_unclosed_one_too():
    assert chat_message("<tool_call>not json</tool_call>", ToolMode("auto"), "hermes")[:2] == (
        "<tool_call>not json</tool_call>",
        [],
    )
    assert chat_message('a <tool_call>{"name": "x"', ToolMode("auto"), "hermes")[:2] == (
        'a <tool_call>{"name": "x"',
        [],
    )


def test_a_streamed_named_call_names_itself_once_then_streams_arguments():
    stream = ChoiceToolStream(ToolMode("named", "weather"), "hermes")
    first = stream.delta('{"ci')
    rest = stream.delta('ty": "Rome"}')
    call = first[0]["tool_calls"][0]
    assert call["function"] == {"name": "weather", "arguments": '{"ci'} and call["index"] == 0
    assert rest == [{"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Rome"}'}}]}]
    assert stream.finish() == [] and stream.num_calls == 1


def test_a_streamed_required_array_sends_its_calls_when_complete():
    stream = ChoiceToolStream(ToolMode("required"), "hermes")
    assert stream.delta('[{"name": "a", "parameters": {"x": 1}},') == []
    assert stream.delta(' {"name": "b", "parameters": {}}]') == []
    calls = [d["tool_calls"][0] for d in stream.finish()]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "a"), (1, "b")]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": 1}
