"""How many proposed tokens each decode may bring into a step, and what the results say about it.

The worker proposes the tokens (it knows each request's last tokens one pipeline step before the
scheduler does); the scheduler only grants *lookahead*: slots in the block table and the token budget
for up to L proposals, decided here per request and per step.

The cost model (docs/speculative-decoding.md, measured by ops/microbench/spec_rows.py): a step of B
decode rows takes about t1 * (1 + rho * (B - 1)), rho = `row_cost` (on a CPU the weights are read
once however many rows there are; each row adds its compute). A step of B requests yields B tokens
without speculation. One more proposal row raises the step's time by rho * t1 and yields, on average,
the probability that it is accepted: for a request whose proposals are accepted with probability
alpha each, its j-th proposal is accepted with about alpha^j. So the j-th proposal pays while

    alpha^j  >  B * rho / (1 + rho * (B - 1))      (the tokens per second it adds beat what it costs)

The right side grows with B: 0.2 at one request (rho 0.2), 0.5 at four, 0.8 at sixteen. A large
batch is compute-bound: speculation backs off by itself, and only near-certain runs stay.

- alpha is each request's exponential average of accepted / proposed tokens (`adaptive`; weight 0.3 on
  the newest step, starting at 0.6). A request that earns no lookahead drifts back toward the start
  value, a little per step, so a request whose text turns repetitive later is tried again.
- Proposals never push a step past `max_step_rows` decode rows; `disable_by_batch_size` is a hard cut.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pagedserve.services.scheduler.request import Request
from pagedserve.shared.speculative_config import SpeculativeConfig

AVERAGE_WEIGHT = 0.3  # of the newest step in the acceptance average
START_ACCEPTANCE = 0.6  # a new request starts hopeful: at one request a proposal costs a fifth of a step
RECOVERY = 0.02  # per step without lookahead, the acceptance average moves this much of the way back


class SpeculationPolicy:
    def __init__(self, config: SpeculativeConfig | None, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len

    @property
    def enabled(self) -> bool:
        return self.config is not None

    def threshold(self, batch: int) -> float:
        """The acceptance probability a proposal needs to pay in a step of `batch` decode rows."""
        rho = self.config.row_cost if self.config else 0.0
        return batch * rho / (1.0 + rho * (batch - 1))

    def wanted(self, req: Request, threshold: float) -> int:
        """The proposals this request would take now, before the step's row budget."""
        config = self.config
        if config is None or not req.sampling.speculate:
            return 0
        k = config.num_speculative_tokens
        alpha = req.spec_acceptance
        if config.adaptive and alpha < 1.0:
            # The longest run whose last proposal is still accepted often enough: alpha^k > threshold.
            k = (
                0
                if alpha <= threshold
                else min(k, int(math.log(threshold) / math.log(alpha)) if threshold > 0 else k)
            )
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
        threshold = self.threshold(len(decodes))
        granted: dict[int, int] = {}
        for req in sorted(decodes, key=lambda r: -r.spec_acceptance):
            k = min(self.wanted(req, threshold), max(0, spare))
            if k > 0:
                granted[id(req)] = k
                spare -= k
            else:
                req.spec_acceptance += RECOVERY * (START_ACCEPTANCE - req.spec_acceptance)
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
