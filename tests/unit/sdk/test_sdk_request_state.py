"""Keeping only what the caller has not seen: the offsets arithmetic, without sockets."""

from __future__ import annotations

import queue

from pagedserve.shared.protocol.codec import decode
from pagedserve.shared.protocol.frontend import CompletionOutput, Delta, Finished, Submit, Usage
from pagedserve.shared.sdk.request_state import LiveRequest


def live() -> LiveRequest:
    return LiveRequest(Submit(request_id="r", prompt="p"), deadline=1e9, sink=queue.SimpleQueue())


def delta(
    offset: int, tokens: list[int], text_offset: int, text: str, logprobs: list[float] | None = None
) -> Delta:
    return Delta(
        request_id="r", offset=offset, text_offset=text_offset, token_ids=tokens, text=text, logprobs=logprobs
    )


def test_a_replay_from_zero_yields_only_the_unseen_tail() -> None:
    req = live()
    assert req.take_delta(delta(0, [1, 2], 0, "ab")) is not None
    replay = req.take_delta(delta(0, [1, 2, 3], 0, "abç", logprobs=[-1.0, -2.0, -3.0]))
    assert replay is not None
    assert (replay.token_ids, replay.text, replay.logprobs) == ([3], "ç", [-3.0])
    assert req.take_delta(delta(0, [1, 2, 3], 0, "abç")) is None  # a second replay adds nothing


def test_text_and_tokens_are_tracked_apart() -> None:
    # A token can add no text yet (half a UTF-8 character), and text can come without a token.
    req = live()
    first = req.take_delta(delta(0, [7], 0, ""))
    assert first is not None and (first.token_ids, first.text) == ([7], "")
    second = req.take_delta(delta(1, [], 0, "é"))
    assert second is not None and (second.token_ids, second.text) == ([], "é")


def test_finished_fills_in_what_the_deltas_did_not_bring() -> None:
    req = live()
    req.take_delta(delta(0, [1], 0, "a"))
    done = Finished(
        request_id="r",
        outputs=[CompletionOutput(index=0, token_ids=[1, 2, 3], text="abc", finish_reason="length")],
        usage=Usage(prompt_tokens=1, completion_tokens=3),
    )
    [rest], _ = req.finish(done)
    assert (rest.token_ids, rest.text) == ([2, 3], "bc")


def test_attach_resubmit_carries_attach_and_the_time_left() -> None:
    req = LiveRequest(
        Submit(request_id="r", prompt="p", timeout_s=10.0), deadline=100.0, sink=queue.SimpleQueue()
    )
    body = decode(req.submit_frame(now=97.0, attach=True))
    assert (body["attach"], body["timeout_s"]) == (True, 3.0)
    assert decode(req.submit_frame(now=97.0, attach=False))["attach"] is False


def test_a_busy_session_keeps_state_only_for_live_requests() -> None:
    from pagedserve.shared.protocol.messages import encode_message
    from pagedserve.shared.sdk.session import Session

    session = Session(heartbeat_s=0.5, reconnect_after_s=3.0, max_message_bytes=1 << 20)
    for i in range(1000):  # each one ends long before its (far) deadline
        req = LiveRequest(Submit(request_id=f"r{i}", prompt="p"), deadline=1e9, sink=queue.SimpleQueue())
        session.submit(req, now=float(i))
        finished = Finished(
            request_id=f"r{i}",
            outputs=[CompletionOutput(index=0, token_ids=[1], text="a", finish_reason="length")],
            usage=Usage(prompt_tokens=1, completion_tokens=1),
        )
        session.on_frame(encode_message(finished), now=float(i))
    assert not session.live
    assert session.num_tracked <= 64 + 1  # not 1000: ended requests do not pile up until their deadline


def _stream(session, rid: str, now: float, deadline: float = 1e9) -> queue.SimpleQueue:
    sink: queue.SimpleQueue = queue.SimpleQueue()
    session.submit(
        LiveRequest(Submit(request_id=rid, prompt="p", stream=True), deadline=deadline, sink=sink), now
    )
    return sink


def test_a_stream_that_keeps_producing_outlives_its_idle_timeout() -> None:
    from pagedserve.shared.protocol.messages import encode_message
    from pagedserve.shared.sdk.session import Session

    session = Session(heartbeat_s=0.5, reconnect_after_s=3.0, max_message_bytes=1 << 20, idle_timeout_s=10.0)
    sink = _stream(session, "r", now=0.0)
    for t in range(1, 60):  # a token every second for a minute: never idle for 10 s
        session.on_frame(encode_message(delta(t - 1, [t], t - 1, "x")), now=float(t))
        assert session.expire(float(t) + 0.5) == []
    assert "r" in session.live
    frames = session.expire(59.0 + 10.0)  # then silence: failed 10 s after its last token
    assert [decode(f)["request_id"] for f in frames] == ["r"]
    while not isinstance(err := sink.get_nowait(), Exception):
        pass
    assert err.code == "timeout" and "idle_timeout_s=10.0" in str(err)


def test_an_idle_stream_fails_at_its_idle_timeout_not_its_total_one() -> None:
    from pagedserve.shared.sdk.session import Session

    session = Session(heartbeat_s=0.5, reconnect_after_s=3.0, max_message_bytes=1 << 20, idle_timeout_s=10.0)
    _stream(session, "idle", now=0.0, deadline=600.0)
    assert session.expire(9.9) == [] and "idle" in session.live
    assert len(session.expire(10.1)) == 1 and "idle" not in session.live


def test_prompt_logprobs_reach_the_caller_once_whatever_is_replayed() -> None:
    from pagedserve.shared.protocol.prompt_logprobs import PromptLogprobs, pack_floats

    prompt = PromptLogprobs(
        token_ids=[4, 9], num_top=0, token_logprobs=pack_floats([-2.0]), top_token_ids=b"", top_logprobs=b""
    )
    req = live()
    first = req.take_delta(Delta(request_id="r", token_ids=[1], text="a", prompt_logprobs=prompt))
    assert first is not None and first.prompt_logprobs == prompt
    replay = req.take_delta(Delta(request_id="r", token_ids=[1, 2], text="ab", prompt_logprobs=prompt))
    assert replay is not None and replay.token_ids == [2] and replay.prompt_logprobs is None
    late = live()  # finished while disconnected: the stored Finished brings them
    done = Finished(
        request_id="r",
        outputs=[CompletionOutput(index=0, token_ids=[1], text="a", finish_reason="length")],
        usage=Usage(prompt_tokens=2, completion_tokens=1),
        prompt_logprobs=prompt,
    )
    (rest,), _ = late.finish(done)
    assert rest.prompt_logprobs == prompt and prompt.logprobs() == [None, -2.0]
