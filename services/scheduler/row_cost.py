"""What one more decode row adds to a step, learned from the worker's own step times: the price the
speculation policy (speculation.py) puts on a proposal where the config's `row_cost` is null.

A constant was wrong by a factor of three either way. On the bundled Q4_1 model (AMD EPYC Zen 3, 2
threads, `ops/microbench/spec_rows.py`, one request of 1 + k rows) a row adds ~0.33-0.37 of a one-row
step with float32 activations (the float tiles multiply every weight once per row) and ~0.1-0.15 with
int8 activations over rows interleaved by 8 (the weights read once, the rows' integer products cheap).
The fixed 0.2 granted too many proposals in the first case and too few in the second, and a machine,
model or load that differs moves it again; the worker measures every step anyway (`step_s`). Opt-in:
inside `bench speculative` on a noisy 2-core machine one float32 run learned 0.67-0.74 and stopped
proposing, where the same fit in a plain loop read 0.35-0.41.
"""

from __future__ import annotations

WEIGHT = 0.1  # of the newest step in each row count's average: follows the context and the load
MIN_STEPS = 3  # a row count's average counts in the fit once it has this many steps
STALE_STEPS = 256  # a row count not seen in this many observed steps drops out of the fit


class RowCost:
    """rho in t(R) = t1 * (1 + rho * (R - 1)), t the time of a step of R decode rows (requests plus the
    proposals they scored): a least-squares line through each row count's running average of its step
    times. Steps with a prompt chunk say nothing about decode rows and are not observed. Until two row
    counts have recent steps, `start`: a price that stopped all proposals would otherwise never see a
    row count above the batch again and stay (one float32 run learned 0.67-0.74 and proposed nothing
    for three workloads); once those row counts go stale the prior returns and proposals are tried."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.means: dict[int, float] = {}
        self.counts: dict[int, int] = {}
        self.seen: dict[int, int] = {}  # row count -> the observation it was last seen at
        self.observed = 0

    def observe(self, rows: int, step_s: float) -> None:
        if rows < 1 or not step_s > 0.0:
            return
        self.observed += 1
        mean = self.means.get(rows)
        self.means[rows] = step_s if mean is None else mean + WEIGHT * (step_s - mean)
        self.counts[rows] = self.counts.get(rows, 0) + 1
        self.seen[rows] = self.observed

    @property
    def value(self) -> float:
        fresh = self.observed - STALE_STEPS
        points = [
            (rows - 1, t)
            for rows, t in self.means.items()
            if self.counts[rows] >= MIN_STEPS and self.seen[rows] > fresh
        ]
        if len(points) < 2:
            return self.start
        n = len(points)
        mean_x = sum(x for x, _ in points) / n
        mean_t = sum(t for _, t in points) / n
        spread = sum((x - mean_x) ** 2 for x, _ in points)
        slope = sum((x - mean_x) * (t - mean_t) for x, t in points) / spread
        t1 = mean_t - slope * mean_x
        if t1 <= 0.0:
            return self.start  # a line through noise: keep the prior rather than a negative step
        return min(10.0, max(0.0, slope / t1))
