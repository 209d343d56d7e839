"""CompletionText and stop strings, with a real (byte-level) tokenizer: one token per byte, so a
stop string or a multi-byte character always spans several tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.tiny_models import save_byte_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.services.checkpoint import load_tokenizer
from pagedserve.services.scheduler.outputs import OutputEvent, RequestDone
from pagedserve.services.scheduler.scheduler import Scheduler, SchedulerLimits
from pagedserve.shared.completion_text import CompletionText, text_decoder
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import StepResult


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    folder: Path = tmp_path_factory.mktemp("byte-tokenizer")
    save_byte_tokenizer(folder)
    return load_tokenizer(folder)


def feed(text: CompletionText, token_ids: list[int]) -> tuple[list[str], bool]:
    """Add tokens one at a time as the scheduler does; the deltas sent, and whether a stop matched."""
    outputs: list[int] = []
    deltas: list[str] = []
    stopped = False
    for token in token_ids:
        outputs.append(token)
        stopped = text.add(outputs)
        if stopped:
            break
        deltas.append(text.take_delta(False, outputs))
    deltas.append(text.take_delta(True, outputs))
    return deltas, stopped


def test_text_that_could_start_a_stop_string_is_held_back(tokenizer):
    text = CompletionText(text_decoder(tokenizer), stop=["STOP"])
    outputs: list[int] = []
    for token in tokenizer.encode("abcST"):
        outputs.append(token)
        text.add(outputs)
    # "ST" may still become "STOP": only what lies beyond len("STOP") - 1 characters is sent.
    assert text.take_delta(False, outputs) == "ab"


def test_a_stop_string_across_token_boundaries_ends_the_text_before_it(tokenizer):
    text = CompletionText(text_decoder(tokenizer), stop=["STOP"])
    deltas, stopped = feed(text, tokenizer.encode("hello STOP and more"))
    assert stopped
    assert "".join(deltas) == "hello " and text.text == "hello "


def test_include_stop_keeps_the_stop_string(tokenizer):
    text = CompletionText(text_decoder(tokenizer), stop=["\n\n"], include_stop=True)
    deltas, stopped = feed(text, tokenizer.encode("one\n\ntwo"))
    assert stopped and "".join(deltas) == "one\n\n"


def test_held_back_text_that_never_became_a_stop_string_is_sent_at_the_end(tokenizer):
    text = CompletionText(text_decoder(tokenizer), stop=["STOP"])
    deltas, stopped = feed(text, tokenizer.encode("ends in ST"))
    assert not stopped and "".join(deltas) == "ends in ST"


def test_a_multi_byte_character_split_across_tokens_is_sent_whole(tokenizer):
    tokens = tokenizer.encode("é€")  # 2 + 3 bytes: five tokens
    assert len(tokens) == 5
    text = CompletionText(text_decoder(tokenizer))
    outputs: list[int] = []
    sent = []
    for token in tokens:
        outputs.append(token)
        text.add(outputs)
        sent.append(text.take_delta(False, outputs))
    assert sent == ["", "é", "", "", "€"]  # never half a character, never U+FFFD


def test_a_cut_character_at_the_end_is_flushed_as_decoded(tokenizer):
    tokens = tokenizer.encode("aé")[:2]  # "a" and the first byte of "é"
    text = CompletionText(text_decoder(tokenizer))
    deltas, _ = feed(text, tokens)
    assert "".join(deltas) == tokenizer.decode(tokens, skip_special_tokens=True)


def test_the_scheduler_stops_on_a_string_that_spans_sampled_tokens(tokenizer):
    bm = BlockManager(lease_ttl_s=100.0)
    bm.add_pool("w0", 32, 8)
    sched = Scheduler(SchedulerLimits(pipeline_depth=1, max_model_len=256), [2], tokenizer)
    sched.add_worker("w0", 32, 8)
    sched.add_request("r", tokenizer.encode("Q:"), SamplingParams(max_tokens=20, stop=["END"]), 0.0)
    answer = tokenizer.encode("fine END ignored")
    events: list[OutputEvent | RequestDone] = []
    for token in answer:
        plan = sched.schedule("w0", 0.0)
        ex = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
        events += sched.on_step_result("w0", StepResult(ex.step, ex.request_ids(), [token]), 0.0)
        if not sched.has_unfinished():
            break
    done = [e for e in events if isinstance(e, RequestDone)]
    streamed = "".join(e.text for e in events if isinstance(e, OutputEvent))
    assert len(done) == 1 and done[0].texts == ["fine "] and streamed == "fine "
    assert done[0].completions[0].finish_reason == "stop"
    assert len(done[0].completions[0].output_token_ids) == len(tokenizer.encode("fine END"))


@given(st.lists(st.integers(min_value=0, max_value=260), max_size=24))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_decoder_gives_the_tokenizers_own_text(tokenizer, token_ids):
    """The Rust tokenizer called directly (where that is allowed) says what tokenizer.decode says,
    special tokens skipped, half characters included."""
    decode = text_decoder(tokenizer)
    assert decode is not None
    assert decode(token_ids) == tokenizer.decode(token_ids, skip_special_tokens=True)


def test_a_tokenizer_that_cleans_up_spaces_is_decoded_by_its_own_decode(tokenizer):
    class CleansUp:
        clean_up_tokenization_spaces = True
        backend_tokenizer = tokenizer.backend_tokenizer

        def decode(self, token_ids, skip_special_tokens=False):
            return "cleaned"

    decode = text_decoder(CleansUp())
    assert decode is not None and decode([1, 2]) == "cleaned"
    assert text_decoder(None) is None
