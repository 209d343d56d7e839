"""One live request as the client sees it: what it sent, when it gives up, and what the caller has.

The server may send a request's output more than once (after a reconnect it replays from token 0),
so each completion remembers how many tokens and characters the caller already has and keeps only
what lies past them. That is what makes a reconnect invisible: no gap, no repeat.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from pagedserve.shared.completion_text import Decode
from pagedserve.shared.protocol.frontend import Delta, Finished, SamplingParams, Submit
from pagedserve.shared.protocol.messages import encode_message
from pagedserve.shared.protocol.prompt_logprobs import PromptLogprobs
from pagedserve.shared.sdk.client_text import ClientText, text_on_client
from pagedserve.shared.sdk.results import RequestError, Result, StreamDelta

Event = StreamDelta | Result | RequestError


class EventSink(Protocol):
    """Where a request's events go: a queue.SimpleQueue (sync) or an asyncio.Queue (async)."""

    def put_nowait(self, item: Event) -> None: ...


def make_submit(
    prompt: str | None,
    prompt_token_ids: list[int] | None,
    *,
    request_id: str | None,
    timeout_s: float,
    stream: bool,
    sampling_params: SamplingParams | None,
    sampling: dict[str, Any],
    tokenizer: Any | None = None,
) -> Submit:
    """Validate everything on the caller's side: a bad field raises pydantic's ValidationError
    here, before anything is sent. With the client's `tokenizer`, a text prompt goes as token ids."""
    if tokenizer is not None and prompt and prompt_token_ids is None:
        prompt, prompt_token_ids = None, list(tokenizer.encode(prompt))
    if sampling_params is not None:
        sampling = {**sampling_params.model_dump(), **sampling}
    sampling = dict(sampling)
    user = sampling.pop("user", None)  # not a sampling field: whom the request is for (per-user limits)
    lora = sampling.pop("lora", None)  # not a sampling field: the LoRA adapter to run with, by name
    return Submit(
        request_id=request_id or uuid.uuid4().hex,
        prompt=prompt,
        prompt_token_ids=prompt_token_ids,
        sampling=SamplingParams(**sampling),
        stream=stream,
        timeout_s=timeout_s,
        user=user,
        lora=lora,
    )


@dataclass(slots=True)
class LiveRequest:
    submit: Submit  # as sent
    deadline: float  # monotonic; past it the client answers "timeout" itself
    sink: EventSink
    text: ClientText | None = None  # set when this side makes the text (client_text.py)
    streams: bool = True  # whether the caller streams: the wire may stream when it does not
    last_event: float = 0.0  # monotonic: the last Accepted or Delta (a stream's idle clock)
    num_prompt_tokens: int | None = None
    aborting: bool = False
    tokens_seen: dict[int, int] = field(default_factory=dict)  # completion index -> tokens delivered
    chars_seen: dict[int, int] = field(default_factory=dict)  # completion index -> characters delivered
    prompt_logprobs_seen: bool = False
    stops: list[tuple[int, int]] = field(default_factory=list)  # (index, tokens) to send as StopAt

    @classmethod
    def start(
        cls, submit: Submit, deadline: float, sink: EventSink, decode: Decode | None = None
    ) -> LiveRequest:
        """A request to send; with `decode`, this side makes its text (the scheduler sends token ids)."""
        if decode is None:
            return cls(submit, deadline, sink, streams=submit.stream)
        wire, text = text_on_client(submit, decode)
        return cls(wire, deadline, sink, text=text, streams=submit.stream)

    @property
    def request_id(self) -> str:
        return self.submit.request_id

    def submit_frame(self, now: float, attach: bool) -> bytes:
        submit = self.submit
        if attach:
            # A restarted scheduler counts the timeout from the re-submit: send what is left of ours.
            left = max(self.deadline - now, 0.001)
            timeout_s = left if submit.timeout_s is None else min(submit.timeout_s, left)
            submit = submit.model_copy(update={"timeout_s": timeout_s, "attach": True})
        return encode_message(submit)

    def take_delta(self, delta: Delta) -> StreamDelta | None:
        """The part of `delta` the caller has not seen, or None when it is all a repeat."""
        tokens, logprobs = self._new_tokens(delta.index, delta.offset, delta.token_ids, delta.logprobs)
        if self.text is not None:
            tokens, logprobs, text, stop = self.text.take(delta.index, tokens, logprobs)
            if stop is not None:
                self.stops.append((delta.index, stop))
        else:
            text = self._new_text(delta.index, delta.text_offset, delta.text)
        if not tokens and not text:
            return None
        return StreamDelta(
            self.request_id, delta.index, tokens, text, logprobs, self._prompt(delta.prompt_logprobs)
        )

    def finish(self, finished: Finished) -> tuple[list[StreamDelta], Finished]:
        """What the final result holds past the last delta (all of it when the request finished while
        we were disconnected: the re-submit is answered with the stored Finished alone), and the result
        as the caller gets it (with the text made here, cut at a stop string, when this side makes it)."""
        rest = []
        for out in sorted(finished.outputs, key=lambda o: o.index):
            tokens, logprobs = self._new_tokens(out.index, 0, out.token_ids, out.logprobs)
            if self.text is not None:
                tokens, logprobs, text, _ = self.text.take(out.index, tokens, logprobs)
                text += self.text.close(out.index)
            else:
                text = self._new_text(out.index, 0, out.text)
            if tokens or text:
                prompt = self._prompt(finished.prompt_logprobs)
                rest.append(StreamDelta(self.request_id, out.index, tokens, text, logprobs, prompt))
        return rest, (finished if self.text is None else self.text.finished(finished))

    def _prompt(self, prompt_logprobs: PromptLogprobs | None) -> PromptLogprobs | None:
        """Once per request: a replay after a reconnect sends them again."""
        if prompt_logprobs is None or self.prompt_logprobs_seen:
            return None
        self.prompt_logprobs_seen = True
        return prompt_logprobs

    def _new_tokens(
        self, index: int, offset: int, token_ids: list[int], logprobs: list[Any] | None
    ) -> tuple[list[int], list[Any] | None]:
        seen = self.tokens_seen.get(index, 0)
        skip = max(0, seen - offset)
        self.tokens_seen[index] = max(seen, offset + len(token_ids))
        tokens = token_ids[skip:]
        if logprobs is not None and len(logprobs) == len(token_ids):
            logprobs = logprobs[skip:]  # one entry per token: trim with them
        return tokens, (logprobs if tokens else None)

    def _new_text(self, index: int, text_offset: int, text: str) -> str:
        # Offsets count characters (code points), as Python's len() does on both ends.
        seen = self.chars_seen.get(index, 0)
        self.chars_seen[index] = max(seen, text_offset + len(text))
        return text[max(0, seen - text_offset) :]
