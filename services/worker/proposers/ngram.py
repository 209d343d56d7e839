"""Prompt lookup: propose the tokens that followed the last time this request's newest n-gram appeared.

vLLM's `ngram` method and llama.cpp's prompt lookup do the same; this one keeps an index per request
instead of scanning: for each n in [min_n, max_n] a dict from n-gram to the end of its latest earlier
occurrence, brought up to date lazily (a decode adds one position, a 2,000-token prompt indexes once in
a few milliseconds). The longest n that matches wins; the proposal is what followed it, up to k tokens.
Code editing, quoting and summarising copy spans of the prompt: there it proposes long runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.services.worker.packed_batch import RequestState


@dataclass(slots=True)
class NgramIndex:
    """One request's n-grams: key -> end position (inclusive) of the latest occurrence indexed."""

    min_n: int
    max_n: int
    tables: list[dict[tuple[int, ...], int]] = field(default_factory=list)
    indexed_to: int = 0  # n-grams ending before this position are in the tables

    def __post_init__(self) -> None:
        self.tables = [{} for _ in range(self.max_n - self.min_n + 1)]

    def catch_up(self, tokens: list[int], end: int) -> None:
        """Index every n-gram ending before `end`."""
        min_n, tables = self.min_n, self.tables
        for pos in range(self.indexed_to, end):
            for i, table in enumerate(tables):
                n = min_n + i
                if pos + 1 >= n:
                    table[tuple(tokens[pos + 1 - n : pos + 1])] = pos
        self.indexed_to = max(self.indexed_to, end)

    def lookup(self, tokens: list[int], k: int) -> tuple[list[int], int]:
        """What followed the longest earlier occurrence of the last n tokens (n from max_n down), and n
        (0: no occurrence)."""
        last = len(tokens) - 1
        self.catch_up(tokens, last)  # not the newest n-grams themselves: they would match at once
        for i in range(len(self.tables) - 1, -1, -1):
            n = self.min_n + i
            if n > len(tokens):
                continue
            end = self.tables[i].get(tuple(tokens[len(tokens) - n :]))
            if end is not None:
                return tokens[end + 1 : end + 1 + k], n
        return [], 0


class NgramProposer:
    """Proposes from the request's own prompt and output (no state outside the request)."""

    name = "ngram"

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, state: RequestState, k: int) -> list[int]:
        return self.match(state, k)[0]

    def match(self, state: RequestState, k: int) -> tuple[list[int], int]:
        """The proposal and the length of the context it matched."""
        index = state.proposal_index
        if index is None:
            index = state.proposal_index = NgramIndex(self.min_n, self.max_n)
        return index.lookup(state.prompt_token_ids + state.output_token_ids, k)

    def finished(self, state: RequestState) -> None:
        """A request the worker forgets: nothing to keep."""
