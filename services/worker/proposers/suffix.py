"""Suffix decoding (after Arctic Inference's): proposals from what earlier requests on this worker wrote.

Agents and tools repeat themselves across requests: the same JSON skeleton, the same tool output, the
same boilerplate. Prompt lookup sees only the request's own tokens; this index also holds the outputs
of the last `max_requests` finished requests, as counts of which token followed each context of
min_n..max_n tokens (a suffix tree cut at that depth, kept as counts). A proposal looks in both: the
request's own tokens (prompt lookup, `ngram.py`), and the shared counts, walked from the longest
matching context, taking the most frequent next token while the product of their frequencies stays
at or above `min_token_prob`. The one whose first token matched the longer context wins (a tie goes
to the shared counts).
"""

from __future__ import annotations

from collections import deque

from pagedserve.services.worker.packed_batch import RequestState
from pagedserve.services.worker.proposers.ngram import NgramProposer

MAX_TOKENS_KEPT = 1024  # of one request's output: the index is Python dicts, so memory is bounded here


class SuffixIndex:
    def __init__(self, min_n: int, max_n: int, max_requests: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.max_requests = max_requests
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}
        self.totals: dict[tuple[int, ...], int] = {}
        self.documents: deque[list[int]] = deque()

    def _contexts(self, tokens: list[int]):
        """(context, next token) for every position and context length."""
        for pos in range(1, len(tokens)):
            for n in range(self.min_n, min(self.max_n, pos) + 1):
                yield tuple(tokens[pos - n : pos]), tokens[pos]

    def add(self, tokens: list[int]) -> None:
        if self.max_requests == 0 or len(tokens) < 2:
            return
        counts, totals = self.counts, self.totals
        for context, token in self._contexts(tokens):
            following = counts.get(context)
            if following is None:
                following = counts[context] = {}
            following[token] = following.get(token, 0) + 1
            totals[context] = totals.get(context, 0) + 1
        self.documents.append(tokens)
        while len(self.documents) > self.max_requests:
            self._remove(self.documents.popleft())

    def _remove(self, tokens: list[int]) -> None:
        counts, totals = self.counts, self.totals
        for context, token in self._contexts(tokens):
            following = counts[context]
            left = following[token] - 1
            if left:
                following[token] = left
            else:
                del following[token]
            if totals[context] == 1:
                del counts[context], totals[context]
            else:
                totals[context] -= 1

    def propose(self, tokens: list[int], k: int, min_prob: float) -> tuple[list[int], int]:
        """The most frequent continuation, and the length of the context its first token matched."""
        context = tokens[-self.max_n :]
        proposal: list[int] = []
        prob, matched = 1.0, 0
        while len(proposal) < k:
            for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
                key = tuple(context[len(context) - n :])
                following = self.counts.get(key)
                if following:
                    break
            else:
                break
            token, count = max(following.items(), key=lambda item: item[1])
            prob *= count / self.totals[key]
            if prob < min_prob:
                break
            matched = matched or n
            proposal.append(token)
            context.append(token)
        return proposal, matched


class SuffixProposer:
    name = "suffix"

    def __init__(self, min_n: int, max_n: int, max_requests: int, min_token_prob: float) -> None:
        self.own = NgramProposer(min_n, max_n)
        self.shared = SuffixIndex(min_n, max_n, max_requests)
        self.min_token_prob = min_token_prob

    def propose(self, state: RequestState, k: int) -> list[int]:
        own, own_n = self.own.match(state, k)
        tail = state.prompt_token_ids[-self.shared.max_n :] + state.output_token_ids[-self.shared.max_n :]
        shared, shared_n = self.shared.propose(tail, k, self.min_token_prob)
        # The longer matched context wins; on a tie, the shared index (what requests actually wrote,
        # with its frequencies) over a single earlier occurrence in this request.
        return shared if shared and shared_n >= own_n else own

    def finished(self, state: RequestState) -> None:
        """Its output (after the prompt's last few tokens, the context of its first token) is indexed."""
        if state.output_token_ids:
            context = state.prompt_token_ids[-self.shared.max_n :]
            self.shared.add(context + state.output_token_ids[:MAX_TOKENS_KEPT])
