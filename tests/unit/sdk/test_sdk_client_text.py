"""The SDK's own text, frame by frame: a stop string found in a delta cuts the tokens the caller sees
and asks the scheduler to stop (again, while it still sends tokens), and the final result is cut there
whatever the scheduler made meanwhile."""

from __future__ import annotations

import queue

import pytest
from harness.tiny_models import save_byte_tokenizer

from pagedserve.services.checkpoint import load_tokenizer
from pagedserve.shared.completion_text import text_decoder
from pagedserve.shared.protocol.frontend import (
    CompletionOutput,
    Delta,
    Finished,
    SamplingParams,
    Submit,
    Usage,
)
from pagedserve.shared.sdk.request_state import LiveRequest


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bytes")
    save_byte_tokenizer(folder)
    return load_tokenizer(folder)


def test_a_stop_found_here_cuts_the_stream_and_the_result(tokenizer):
    submit = Submit(request_id="r", prompt_token_ids=[5], sampling=SamplingParams(stop=["cd"]), stream=False)
    req = LiveRequest.start(submit, 1e9, queue.SimpleQueue(), text_decoder(tokenizer))
    # On the wire: token ids only, the stop strings kept here, streamed so the stop is seen early.
    assert not req.submit.detokenize and req.submit.sampling.stop == [] and req.submit.stream
    assert not req.streams
    ids = tokenizer.encode("abcdef", add_special_tokens=False)
    first = req.take_delta(Delta(request_id="r", token_ids=ids[:2], text=""))
    assert first is not None and first.text == "a"  # "b" held back: it may start "cd"
    cut = req.take_delta(Delta(request_id="r", offset=2, token_ids=ids[2:5], text=""))
    assert cut is not None and cut.token_ids == ids[2:4] and cut.text == "b"
    assert req.stops == [(0, 4)]
    req.stops.clear()
    assert req.take_delta(Delta(request_id="r", offset=5, token_ids=ids[5:], text="")) is None
    assert req.stops == [(0, 4)]  # the scheduler still generates: said again
    done = Finished(
        request_id="r",
        outputs=[CompletionOutput(index=0, token_ids=ids, text="", finish_reason="length")],
        usage=Usage(prompt_tokens=1, completion_tokens=6),
    )
    rest, result = req.finish(done)
    assert rest == []
    assert result.outputs[0].token_ids == ids[:4] and result.outputs[0].text == "ab"
    assert result.outputs[0].finish_reason == "stop" and result.usage.completion_tokens == 4


def test_without_a_stop_the_whole_text_is_made_at_the_end(tokenizer):
    submit = Submit(request_id="r", prompt="hi", stream=False)
    req = LiveRequest.start(submit, 1e9, queue.SimpleQueue(), text_decoder(tokenizer))
    assert not req.submit.stream  # nothing to watch for: no deltas on the wire
    ids = tokenizer.encode("héllo", add_special_tokens=False)
    done = Finished(
        request_id="r",
        outputs=[CompletionOutput(index=0, token_ids=ids, text="", finish_reason="length")],
        usage=Usage(prompt_tokens=2, completion_tokens=len(ids)),
    )
    (rest,), result = req.finish(done)
    assert rest.text == "héllo" and result.outputs[0].text == "héllo"
    assert result.outputs[0].finish_reason == "length"
