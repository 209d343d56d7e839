"""How many proposed tokens each decode may bring into a step, and what the results say about it.

The worker proposes the tokens (it knows each request's last tokens one pipeline step before the
scheduler does); the scheduler only grants *lookahead*: slots in the block table and the token budget
for up to L proposals, decided here per request and per step.

The cost model (docs/speculative-decoding.md, measured by ops/microbench/spec_rows.py): a step of R
decode rows takes about t1 * (1 + rho * (R - 1)) (on a CPU the weights are read once however many rows
there are; each row adds its compute). rho is the config's `row_cost` (0.2 by default), or with `null`
learned from the worker's step times (row_cost.py), from 0.2. A step's expected tokens are one per
decode plus each proposal's chance of being accepted: for a request whose first proposal is accepted
with probability alpha and each later one, once the one before it was, with probability beta, its j-th
proposal is accepted with about alpha * beta^(j-1) (p_j below). One more proposal row pays while it adds
more tokens per unit of time than the step already makes:

    p_j  >  rho * tokens / (1 + rho * (rows - 1))

With nothing granted yet (tokens = rows = B decodes) the right side is 0.2 at one request (rho 0.2),
0.5 at four, 0.8 at sixteen, and it rises as rows are added. A large batch is compute-bound:
speculation backs off by itself there, and only near-certain runs stay.

- alpha and beta are each request's exponential averages (`adaptive`; weight 0.3 on the newest step,
  both starting at 0.6, where p_j is 0.6^j). Two of them because acceptance comes in runs: text that
  copies its context is accepted token after token until it stops copying, so a single average of
  accepted / proposed (0.65-0.78 on the bundled model's code editing and quoting) priced the sixth
  proposal of a run at 0.65^6 = 0.08 when it is accepted far more often. A request that earns no
  lookahead drifts back toward the start values, a little per step, so a request whose text turns
  repetitive later is tried again.
- Proposals never push a step past `max_step_rows` decode rows (16: past that the measured step time
  grows faster than the model says); `disable_by_batch_size` is a hard cut.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedserve.services.scheduler.request import Request
from pagedserve.services.scheduler.row_cost import RowCost
from pagedserve.shared.speculative_config import SpeculativeConfig

AVERAGE_WEIGHT = 0.3  # of the newest step in the acceptance average
START_ACCEPTANCE = 0.6  # a new request starts hopeful: at one request a proposal costs a fifth of a step
START_ROW_COST = 0.2  # the price of a row until the worker's step times say otherwise
RECOVERY = 0.02  # per step without lookahead, the acceptance average moves this much of the way back


class SpeculationPolicy:
    def __init__(self, config: SpeculativeConfig | None, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.learned = RowCost(START_ROW_COST)

    @property
    def learns(self) -> bool:
        """Speculating with `row_cost: null`: the price comes from the worker's step times."""
        return self.config is not None and self.config.row_cost is None

    @property
    def row_cost(self) -> float:
        """What one more row adds to a step, as a share of a one-row step: the config's, or learned."""
        fixed = None if self.config is None else self.config.row_cost
        return self.learned.value if fixed is None else fixed

    @property
    def enabled(self) -> bool:
        return self.config is not None

    def cap(self, req: Request) -> int:
        """The most proposals this request could use now, whatever they cost."""
        config = self.config
        if config is None or not req.sampling.speculate:
            return 0
        # Never past what could be used: max_tokens (the step itself gives one) and the context.
        left = req.sampling.max_tokens - len(req.output_token_ids) - req.pending - 1
        room = self.max_model_len - req.num_slots_used - 1
        own = req.sampling.num_speculative_tokens
        most = config.num_speculative_tokens if own is None else min(own, config.num_speculative_tokens)
        return max(0, min(most, left, room))

    def grant(self, decodes: Sequence[Request]) -> dict[int, int]:
        """id(request) -> lookahead for the decodes of one step (absent: none).

        Proposal rows are handed out one at a time, round by round (every request's first proposal,
        then every second one, ...), best acceptance first, each while it pays: its acceptance
        probability alpha^j beats rho x tokens / (1 + rho x (rows - 1)), the expected tokens per unit
        of step time the step already has."""
        config = self.config
        if config is None or not decodes:
            return {}
        if config.disable_by_batch_size is not None and len(decodes) >= config.disable_by_batch_size:
            return {}
        rho = self.row_cost
        rows = len(decodes)
        tokens = float(rows)  # expected tokens of the step: one per decode, plus accepted proposals
        caps = {id(r): self.cap(r) for r in decodes}
        order = sorted(decodes, key=lambda r: -r.spec_acceptance)
        granted: dict[int, int] = {}
        for j in range(1, config.num_speculative_tokens + 1):
            progressed = False
            for req in order:
                if rows >= config.max_step_rows:
                    break
                if granted.get(id(req), 0) != j - 1 or j > caps[id(req)]:
                    continue
                accept = req.spec_acceptance * req.spec_continuation ** (j - 1) if config.adaptive else 1.0
                if accept <= rho * tokens / (1.0 + rho * (rows - 1)):
                    continue
                granted[id(req)] = j
                rows += 1
                tokens += accept
                progressed = True
            if not progressed:
                break
        for req in decodes:
            if id(req) not in granted:
                req.spec_acceptance += RECOVERY * (START_ACCEPTANCE - req.spec_acceptance)
                req.spec_continuation += RECOVERY * (START_ACCEPTANCE - req.spec_continuation)
        return granted

    @staticmethod
    def on_outcome(req: Request, lookahead: int, num_proposed: int, num_accepted: int) -> None:
        """A step with `lookahead` slots for this request came back: the rejected slots are free for
        the next tokens, and the acceptance averages move (only when something was proposed): alpha by
        whether the first proposal was accepted, beta by how many of the later ones reached (each whose
        predecessor was accepted) were."""
        req.num_slots_used -= lookahead - num_accepted
        req.lookahead_in_flight -= lookahead
        if num_proposed:
            req.num_proposed += num_proposed
            req.num_accepted += num_accepted
            first = 1.0 if num_accepted else 0.0
            req.spec_acceptance += AVERAGE_WEIGHT * (first - req.spec_acceptance)
            reached = min(num_proposed, num_accepted + 1) - 1  # proposals 2.. whose predecessor was accepted
            if reached:
                rate = (num_accepted - 1) / reached
                req.spec_continuation += AVERAGE_WEIGHT * (rate - req.spec_continuation)
