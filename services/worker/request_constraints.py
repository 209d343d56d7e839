"""The worker's side of output constraints: one grammar matcher per constrained request it holds.

Matchers live here, beside the request's tokens, rather than in the scheduler: with a pipeline depth
of 2 or more the scheduler sends step N+1 before it knows step N's token, while the worker samples
in order and so always knows the state the next mask depends on. Nothing crosses the wire per step:
the constraint arrives once, in the request's sampling params, and the mask is built and applied in
this process. A request that arrives again (recompute after preemption, a move off a dead worker)
carries every token it has accepted; its matcher is rebuilt by replaying them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagedserve.services.worker.packed_batch import RequestState

if TYPE_CHECKING:
    from pagedserve.services.constraints.compiler import ConstraintCompiler
    from pagedserve.services.constraints.matcher import SequenceMatcher, TokenMask


class RequestConstraints:
    def __init__(self, model_path: Path, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        self._model_path = model_path
        self._vocab_size = vocab_size
        self._stop_token_ids = list(stop_token_ids)
        self._compiler: ConstraintCompiler | None = None  # built at the first constrained request

    @property
    def compiler(self) -> ConstraintCompiler:
        if self._compiler is None:
            from pagedserve.services.constraints.compiler import ConstraintCompiler  # lazily: xgrammar

            self._compiler = ConstraintCompiler.for_model(
                self._model_path, self._vocab_size, self._stop_token_ids
            )
        return self._compiler

    def matcher_of(self, state: RequestState) -> SequenceMatcher | None:
        """The request's matcher, built (and replayed over its accepted tokens) on first use."""
        spec = state.sampling.structured_outputs
        if state.matcher is None and spec is not None:
            from pagedserve.services.constraints.matcher import SequenceMatcher

            state.matcher = SequenceMatcher.start(self.compiler.compile(spec), state.output_token_ids)
        return state.matcher

    def mask(self, states: Sequence[RequestState]) -> TokenMask | None:
        return self.mask_rows([(s, []) for s in states])

    def mask_rows(self, rows: Sequence[tuple[RequestState, Sequence[int]]]) -> TokenMask | None:
        """The mask of one step's logits rows: per request one row, and one more per proposed token
        (row j: the grammar's state after the first j proposals, which `allowed_prefix` checked)."""
        matchers: list[Any] = [self.matcher_of(s) for s, _ in rows]
        if all(m is None for m in matchers):
            return None  # the unconstrained step: nothing built, nothing applied
        from pagedserve.services.constraints.matcher import build_mask, build_mask_along

        if not any(proposed for _, proposed in rows):
            return build_mask(matchers, self._vocab_size)
        return build_mask_along(
            [(m, list(proposed)) for m, (_, proposed) in zip(matchers, rows, strict=True)], self._vocab_size
        )

    def allowed_prefix(self, state: RequestState, proposed: Sequence[int]) -> int:
        """How many leading proposed tokens the request's grammar accepts (checked, then rolled back)."""
        matcher = self.matcher_of(state)
        return len(proposed) if matcher is None else matcher.allowed_prefix(proposed)

    def fork(self, parent: RequestState) -> SequenceMatcher | None:
        matcher = self.matcher_of(parent)
        return None if matcher is None else matcher.fork()
