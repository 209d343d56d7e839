"""One sequence's position in its grammar, and the packed masks of one step's constrained rows.

A matcher is rebuilt from the tokens a sequence has already accepted whenever the sequence arrives on
a worker (a new request, a recompute after preemption, a move off a dead worker): replaying them puts
it exactly where live decoding had it. Tokens after the grammar's end (the pipeline may sample one
more step for a sequence that already stopped; the scheduler drops it) are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import xgrammar as xgr


class ConstraintViolation(RuntimeError):
    """A token the grammar does not allow reached a matcher: a mask was not applied (a bug)."""


class SequenceMatcher:
    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self._matcher = matcher
        self.num_accepted = 0

    @classmethod
    def start(cls, compiled: xgr.CompiledGrammar, accepted: Sequence[int] = ()) -> SequenceMatcher:
        matcher = cls(xgr.GrammarMatcher(compiled))
        for token in accepted:
            matcher.accept(token)
        return matcher

    @property
    def finished(self) -> bool:
        """The grammar accepted its stop token: nothing more is constrained."""
        return self._matcher.is_terminated()

    def accept(self, token: int) -> None:
        if self.finished:
            return
        if not self._matcher.accept_token(token):
            raise ConstraintViolation(
                f"token {token} is not allowed after {self.num_accepted} accepted tokens"
            )
        self.num_accepted += 1

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the grammar accepts, up to its end; the matcher is left as it was."""
        taken = 0
        for token in tokens:
            if self.finished or not self._matcher.accept_token(token):
                break
            taken += 1
        if taken:
            self._matcher.rollback(taken)
        return taken

    def fill_along(self, bitmask: torch.Tensor, first_row: int, tokens: Sequence[int]) -> None:
        """Rows first_row .. first_row + len(tokens): the masks after 0, 1, ... of `tokens` (which the
        grammar accepts: `allowed_prefix`); a row past the grammar's end allows every token."""
        taken = 0
        for j in range(len(tokens) + 1):
            if self.finished:
                bitmask[first_row + j].fill_(-1)  # every bit set: unconstrained, like a finished row
            else:
                self._matcher.fill_next_token_bitmask(bitmask, first_row + j)
            if j < len(tokens) and not self.finished:
                if not self._matcher.accept_token(tokens[j]):
                    raise ConstraintViolation(
                        f"proposed token {tokens[j]} is not allowed: check allowed_prefix"
                    )
                taken += 1
        if taken:
            self._matcher.rollback(taken)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def fork(self) -> SequenceMatcher:
        child = SequenceMatcher(self._matcher.fork())
        child.num_accepted = self.num_accepted
        return child


@dataclass(slots=True)
class TokenMask:
    """Which tokens each constrained row may sample: `bitmask[j]` (int32 words, bit t%32 of word t//32)
    is row `rows[j]`'s. Rows not named are unconstrained and cost nothing."""

    rows: list[int]
    bitmask: torch.Tensor  # [len(rows), ceil(vocab / 32)] int32


def build_mask(matchers: Sequence[SequenceMatcher | None], vocab_size: int) -> TokenMask | None:
    """The packed mask of the rows whose matcher is live; None when no row is constrained."""
    live = [(i, m) for i, m in enumerate(matchers) if m is not None and not m.finished]
    if not live:
        return None
    bitmask = xgr.allocate_token_bitmask(len(live), vocab_size)
    for j, (_, matcher) in enumerate(live):
        matcher.fill(bitmask, j)
    rows = [i for i, _ in live]
    return TokenMask(rows, bitmask)


def build_mask_along(
    rows: Sequence[tuple[SequenceMatcher | None, list[int]]], vocab_size: int
) -> TokenMask | None:
    """The mask of logits rows laid out request by request, 1 + len(proposed) rows each: row j of a
    constrained request is its grammar's state after its first j proposed tokens."""
    constrained: list[int] = []
    starts: list[tuple[SequenceMatcher, int, list[int]]] = []
    at = 0
    for matcher, proposed in rows:
        if matcher is not None and not matcher.finished:
            starts.append((matcher, len(constrained), proposed))
            constrained.extend(range(at, at + 1 + len(proposed)))
        at += 1 + len(proposed)
    if not constrained:
        return None
    bitmask = xgr.allocate_token_bitmask(len(constrained), vocab_size)
    for matcher, first, proposed in starts:
        matcher.fill_along(bitmask, first, proposed)
    return TokenMask(constrained, bitmask)


def apply_mask(logits: torch.Tensor, mask: TokenMask) -> None:
    """Forbidden tokens' logits become -inf, in place (float32 logits on the CPU)."""
    if len(mask.rows) == logits.shape[0]:
        xgr.apply_token_bitmask_inplace(logits, mask.bitmask, vocab_size=logits.shape[1])
        return
    rows = torch.tensor(mask.rows, device=logits.device)
    constrained = logits.index_select(0, rows)
    xgr.apply_token_bitmask_inplace(constrained, mask.bitmask.to(logits.device), vocab_size=logits.shape[1])
    logits.index_copy_(0, rows, constrained)
