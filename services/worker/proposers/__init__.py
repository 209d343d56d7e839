"""Where a speculating decode's proposed tokens come from (docs/speculative-decoding.md).

A proposer is asked, per decode with lookahead L, for up to L tokens that might come next; the runner
verifies them in the same forward as the decode. Proposals never change what is generated, only how
many tokens one step yields: a wrong one is rejected by the target's own sampling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pagedserve.services.worker.packed_batch import RequestState
from pagedserve.services.worker.proposers.ngram import NgramProposer
from pagedserve.services.worker.proposers.suffix import SuffixProposer
from pagedserve.shared.speculative_config import SpeculativeConfig

if TYPE_CHECKING:
    from pagedserve.services.worker.proposers.draft_model import TargetFacts


class Proposer(Protocol):
    name: str

    def propose(self, state: RequestState, k: int) -> list[int]:
        """Up to k tokens that may follow the request's known tokens (deterministic: q is one-hot)."""
        ...

    def finished(self, state: RequestState) -> None:
        """The worker forgets the request (finished, preempted or aborted)."""
        ...


def propose_all(proposer: Proposer, items: list[tuple[RequestState, int]]) -> list[list[int]]:
    """Up to k tokens for each (request, k): in one batch where the proposer runs a model, else one by one."""
    batched = getattr(proposer, "propose_batch", None)
    if batched is not None:
        return batched(items)
    return [proposer.propose(state, k) for state, k in items]


def make_proposer(config: SpeculativeConfig, target: TargetFacts | None = None) -> Proposer:
    """target: how the worker runs its model (a draft model runs the same way, on a pool of its own)."""
    if config.method == "draft_model":
        if target is None or config.model is None:
            raise ValueError("speculative method draft_model needs a model and the target's facts")
        from pagedserve.services.worker.proposers.draft_model import DraftModelProposer  # loads torch models

        return DraftModelProposer(config.model, target)
    if config.method == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    if config.method == "suffix":
        return SuffixProposer(
            config.prompt_lookup_min,
            config.prompt_lookup_max,
            config.suffix_decoding_max_cached_requests,
            config.suffix_decoding_min_token_prob,
        )
    raise ValueError(f"speculative method {config.method!r} is not available in this worker")
