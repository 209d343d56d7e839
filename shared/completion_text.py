"""Incremental detokenization of one completion, and its stop strings.

The scheduler runs it for clients that want text from it; a client that makes its own text (the SDK
given a tokenizer: the API) runs the very same code on its side, so the text is the same either way.
Text is decoded incrementally (two offsets into the output tokens, so each token costs a decode of
a few tokens, not of the whole output) and held back by `max(len(stop)) - 1` characters while
stop strings are set: a client never sees text that a later token turns into a stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class Tokenizer(Protocol):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


Decode = Callable[[Sequence[int]], str]


def text_decoder(tokenizer: Tokenizer | None) -> Decode | None:
    """`tokenizer.decode(ids, skip_special_tokens=True)`, called on the Rust tokenizer itself where that
    gives the same text (a fast tokenizer with no clean-up of spaces): a quarter of the cost, and this
    runs twice per generated token on the scheduler's thread."""
    if tokenizer is None:
        return None
    backend: Any = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


@dataclass(slots=True)
class CompletionText:
    decode: Decode | None
    stop: list[str] = field(default_factory=list)
    include_stop: bool = False
    text: str = ""  # decoded so far (may run ahead of what was emitted)
    emitted: int = 0  # characters of `text` already sent to the client
    prefix_offset: int = 0
    read_offset: int = 0
    stopped_at: int | None = None  # end of the text kept when a stop string matched

    @property
    def holdback(self) -> int:
        return max((len(s) for s in self.stop), default=1) - 1

    def add(self, output_token_ids: list[int]) -> bool:
        """Decode what the newest tokens add; True when a stop string matched."""
        if self.decode is None:
            return False
        before = self.decode(output_token_ids[self.prefix_offset : self.read_offset])
        after = self.decode(output_token_ids[self.prefix_offset :])
        # A trailing U+FFFD is a multi-byte character cut in half: wait for its next token.
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return False
        new = after[len(before) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(output_token_ids)
        start = max(0, len(self.text) - self.holdback)
        self.text += new
        for s in self.stop:
            at = self.text.find(s, start)
            if at != -1:
                end = at + len(s) if self.include_stop else at
                if self.stopped_at is None or end < self.stopped_at:
                    self.stopped_at = end
        return self.stopped_at is not None

    def take_delta(self, finished: bool, output_token_ids: list[int]) -> str:
        """Text the client has not seen yet; on finish, everything that is kept."""
        if finished:
            if self.stopped_at is not None:
                self.text = self.text[: self.stopped_at]
            elif self.decode is not None:
                self.text = self.decode(output_token_ids)  # flush a held-back partial character
            end = len(self.text)
        else:
            end = len(self.text) - self.holdback if self.stop else len(self.text)
        if end <= self.emitted:
            return ""
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
