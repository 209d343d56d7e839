"""Text made on the client's side: the SDK given a tokenizer submits with `detokenize=False`, so the
scheduler sends token ids only, and this turns them into text and finds the stop strings.

It runs the scheduler's own code (shared/completion_text.py) on the same tokens in the same order, so
the text, the held-back characters and where a stop string ends a completion are what the scheduler
would have made. A stop string found here ends the completion at once for the caller (tokens after it
are never shown) and is sent to the scheduler as StopAt, which stops it there; the final result is cut
at the same token whatever the scheduler made meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagedserve.shared.completion_text import CompletionText, Decode
from pagedserve.shared.protocol.frontend import CompletionOutput, Finished, Submit


@dataclass(slots=True)
class _Completion:
    text: CompletionText
    tokens: list[int] = field(default_factory=list)
    stopped: int | None = None  # output tokens kept, once a stop string ended it


@dataclass(slots=True)
class ClientText:
    decode: Decode
    stop: list[str]
    include_stop: bool
    completions: dict[int, _Completion] = field(default_factory=dict)

    def _of(self, index: int) -> _Completion:
        if index not in self.completions:
            self.completions[index] = _Completion(CompletionText(self.decode, self.stop, self.include_stop))
        return self.completions[index]

    def take(
        self, index: int, new_tokens: list[int], logprobs: list[Any] | None
    ) -> tuple[list[int], list[Any] | None, str, int | None]:
        """Of tokens past those seen: the ones the caller gets, their logprobs, the text they add; and,
        when a stop string has ended the completion, the token count to tell the scheduler."""
        c = self._of(index)
        if c.stopped is not None:
            return [], None, "", (c.stopped if new_tokens else None)  # said again: it may have missed it
        kept = 0
        for token in new_tokens:
            c.tokens.append(token)
            kept += 1
            if c.text.add(c.tokens):
                c.stopped = len(c.tokens)
                break
        text = c.text.take_delta(c.stopped is not None, c.tokens)
        lps = logprobs[:kept] if logprobs is not None and len(logprobs) == len(new_tokens) else logprobs
        return new_tokens[:kept], lps if kept else None, text, c.stopped

    def close(self, index: int) -> str:
        """The completion ended: the text held back so far (a partial character, a possible stop)."""
        c = self._of(index)
        return c.text.take_delta(True, c.tokens)

    def output(self, out: CompletionOutput) -> CompletionOutput:
        """The scheduler's output (token ids, no text) as the caller gets it: cut at the stop string."""
        c = self._of(out.index)
        if c.stopped is None:
            return out.model_copy(update={"text": c.text.text})
        logprobs = out.logprobs[: c.stopped] if out.logprobs is not None else None
        return out.model_copy(
            update={
                "token_ids": out.token_ids[: c.stopped],
                "text": c.text.text,
                "finish_reason": "stop",
                "logprobs": logprobs,
            }
        )

    def finished(self, message: Finished) -> Finished:
        outputs = [self.output(o) for o in message.outputs]
        usage = message.usage.model_copy(update={"completion_tokens": sum(len(o.token_ids) for o in outputs)})
        return message.model_copy(update={"outputs": outputs, "usage": usage})


def text_on_client(submit: Submit, decode: Decode) -> tuple[Submit, ClientText]:
    """The submit to send when the client makes the text, and the text's state. Stop strings stay here;
    a request with some streams on the wire even when its caller waits for the whole result, so that a
    stop is seen (and stopped) as soon as it is generated."""
    sampling = submit.sampling
    text = ClientText(decode, list(sampling.stop), sampling.include_stop_str_in_output)
    wire = submit.model_copy(
        update={
            "detokenize": False,
            "stream": submit.stream or bool(sampling.stop),
            "sampling": sampling.model_copy(update={"stop": [], "include_stop_str_in_output": False}),
        }
    )
    return wire, text
