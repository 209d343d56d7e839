"""How many proposed tokens each decode may bring into a step, and what the results say about it.

The worker proposes the tokens (it knows each request's last tokens one pipeline step before the
scheduler does); the scheduler only grants *lookahead*: slots in the block table and the token budget
for up to L proposals, decided here per request and per step.

- A step is cheap while it has few rows: on a CPU a one-row decode reads every weight once, and a few
  more rows reuse what was read. Proposals fill a step only up to `max_step_rows` decode rows, best
  acceptance first; a batch that already has that many rows gets none (it is compute-bound: every
  proposal costs a row, and at most gives back one token).
- Each request's L follows its acceptance (`adaptive`): an exponential average of accepted / proposed
  tokens, and L the longest run whose last token is still accepted with probability >= ACCEPT_FLOOR
  (alpha^L >= floor). At least one token stays on offer, so a request can always recover.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pagedserve.services.scheduler.request import Request
from pagedserve.shared.speculative_config import SpeculativeConfig

ACCEPT_FLOOR = 0.3  # the last proposal of a run is still worth a row at this acceptance probability
AVERAGE_WEIGHT = 0.3  # of the newest step in the acceptance average
START_ACCEPTANCE = 0.6  # a new request starts hopeful: a proposal is one row, a hit saves a step


class SpeculationPolicy:
    def __init__(self, config: SpeculativeConfig | None, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len

    @property
    def enabled(self) -> bool:
        return self.config is not None

    def wanted(self, req: Request) -> int:
        """The proposals this request would take now, before the step's row budget."""
        config = self.config
        if config is None or not req.sampling.speculate:
            return 0
        k = config.num_speculative_tokens
        if config.adaptive:
            alpha = req.spec_acceptance
            if alpha < 1.0:
                k = min(k, max(1, int(math.log(ACCEPT_FLOOR) / math.log(max(alpha, 1e-6)))))
        # Never past what could be used: max_tokens (the step itself gives one) and the context.
        left = req.sampling.max_tokens - len(req.output_token_ids) - req.pending - 1
        room = self.max_model_len - req.num_slots_used - 1
        return max(0, min(k, left, room))

    def grant(self, decodes: Sequence[Request]) -> dict[int, int]:
        """id(request) -> lookahead for the decodes of one step (absent: none)."""
        config = self.config
        if config is None or not decodes:
            return {}
        if config.disable_by_batch_size is not None and len(decodes) >= config.disable_by_batch_size:
            return {}
        spare = config.max_step_rows - len(decodes)
        if spare <= 0:
            return {}
        granted: dict[int, int] = {}
        for req in sorted(decodes, key=lambda r: -r.spec_acceptance):
            k = min(self.wanted(req), spare)
            if k > 0:
                granted[id(req)] = k
                spare -= k
                if spare == 0:
                    break
        return granted

    @staticmethod
    def on_outcome(req: Request, lookahead: int, num_proposed: int, num_accepted: int) -> None:
        """A step with `lookahead` slots for this request came back: the rejected slots are free for
        the next tokens, and the acceptance average moves (only when something was proposed)."""
        req.num_slots_used -= lookahead - num_accepted
        req.lookahead_in_flight -= lookahead
        if num_proposed:
            req.num_proposed += num_proposed
            req.num_accepted += num_accepted
            rate = num_accepted / num_proposed
            req.spec_acceptance += AVERAGE_WEIGHT * (rate - req.spec_acceptance)
