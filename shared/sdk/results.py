"""What the SDK hands back: a finished request's Result, a stream's StreamDelta, a RequestError.

Plain frozen dataclasses, built from validated server messages; nothing here touches a socket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedserve.shared.protocol.frontend import Finished
from pagedserve.shared.protocol.pooling import unpack_floats
from pagedserve.shared.protocol.prompt_logprobs import PromptLogprobs


class RequestError(Exception):
    """A request that did not produce a result. `code` is stable and machine-readable.

    Codes come from the server (`invalid_request`, `no_workers`, `duplicate_request_id`, ...) or
    from the SDK itself: `timeout` (no result before the request's timeout), `closed` (the client
    was closed while the request was live), `internal` (the client's I/O loop failed).

        try:
            client.generate("Hi", max_tokens=8, timeout_s=5)
        except RequestError as e:
            print(e.code, e.message, e.request_id)
    """

    def __init__(self, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(f"[{code}] {message}" + (f" (request {request_id})" if request_id else ""))
        self.code = code
        self.message = message
        self.request_id = request_id

    def __reduce__(self) -> tuple[Any, ...]:  # keep code/message when pickled across processes
        return (type(self), (self.code, self.message, self.request_id))


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """New output of one completion (`index` < n): tokens and text the caller has not seen yet.
    `prompt_logprobs` (sampling.prompt_logprobs) comes once, on the request's first delta."""

    request_id: str
    index: int
    token_ids: list[int]
    text: str
    logprobs: list[Any] | None = None
    prompt_logprobs: PromptLogprobs | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Completion:
    """One of the n completions of a request."""

    index: int
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[Any] | None = None


@dataclass(frozen=True, slots=True)
class Result:
    """A finished request. `text`, `token_ids`, `finish_reason` and `logprobs` are those of the
    first completion; `outputs` holds all n of them, in index order. `prompt_logprobs`: the
    prompt's own token logprobs when sampling.prompt_logprobs asked for them (`.logprobs()`, `.top()`).

        result = client.generate("Hello", max_tokens=8, temperature=0.0)
        print(result.text, result.finish_reason, result.usage.completion_tokens)
    """

    request_id: str
    outputs: list[Completion]
    usage: Usage
    num_prompt_tokens: int
    prompt_logprobs: PromptLogprobs | None = None
    pooled: bytes | None = None  # sampling.pooling: the vector, float32 little-endian

    @property
    def vector(self) -> list[float]:
        """A pooling request's vector (an embedding, or the logits of `pooling.token_ids`)."""
        if self.pooled is None:
            raise ValueError(f"request {self.request_id!r} did not ask for pooling: it has no vector")
        return unpack_floats(self.pooled)

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list[Any] | None:
        return self.outputs[0].logprobs

    @classmethod
    def from_finished(cls, message: Finished, num_prompt_tokens: int | None) -> Result:
        outputs = [
            Completion(o.index, list(o.token_ids), o.text, o.finish_reason, o.logprobs)
            for o in sorted(message.outputs, key=lambda o: o.index)
        ]
        usage = Usage(
            message.usage.prompt_tokens, message.usage.completion_tokens, message.usage.cached_tokens
        )
        # A re-submitted finished id is answered with Finished alone (no Accepted): usage knows the count.
        prompt_tokens = num_prompt_tokens if num_prompt_tokens is not None else usage.prompt_tokens
        return cls(message.request_id, outputs, usage, prompt_tokens, message.prompt_logprobs, message.pooled)
