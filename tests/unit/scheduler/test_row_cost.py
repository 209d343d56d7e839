"""Speculation's price of a proposal row, learned from the worker's step times (row_cost.py)."""

from __future__ import annotations

import random

import pytest

from pagedserve.services.scheduler.row_cost import MIN_STEPS, STALE_STEPS, RowCost


def steps(cost: RowCost, rho: float, t1: float, rows: range, rounds: int, noise: float = 0.0, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(rounds):
        for r in rows:
            cost.observe(r, t1 * (1 + rho * (r - 1)) * (1 + rng.uniform(-noise, noise)))


def test_the_start_value_holds_until_two_row_counts_have_steps():
    cost = RowCost(0.2)
    steps(cost, rho=0.5, t1=0.01, rows=range(1, 2), rounds=50)
    assert cost.value == 0.2  # one row count: no slope to read
    steps(cost, rho=0.5, t1=0.01, rows=range(4, 5), rounds=MIN_STEPS - 1)
    assert cost.value == 0.2  # the second has too few steps
    steps(cost, rho=0.5, t1=0.01, rows=range(4, 5), rounds=1)
    assert cost.value == pytest.approx(0.5)


@pytest.mark.parametrize("rho", [0.0, 0.12, 0.35, 1.5])
def test_it_reads_the_cost_of_a_row_through_noisy_steps(rho: float):
    cost = RowCost(0.2)
    steps(cost, rho=rho, t1=0.008, rows=range(1, 8), rounds=60, noise=0.1)
    assert cost.value == pytest.approx(rho, abs=0.03 + 0.1 * rho)


def test_it_follows_a_change_in_what_rows_cost():
    cost = RowCost(0.2)
    steps(cost, rho=0.1, t1=0.008, rows=range(1, 6), rounds=40)
    assert cost.value == pytest.approx(0.1, abs=0.01)
    steps(cost, rho=0.4, t1=0.008, rows=range(1, 6), rounds=60)  # e.g. the machine got busier
    assert cost.value == pytest.approx(0.4, abs=0.02)


def test_a_line_that_makes_no_sense_keeps_the_start_value():
    cost = RowCost(0.2)
    for _ in range(MIN_STEPS):
        cost.observe(2, 0.001)
        cost.observe(
            4, 0.020
        )  # the line through these crosses zero before one row: no one-row step to price by
        cost.observe(0, 0.5)  # not a step of rows: ignored
        cost.observe(3, 0.0)  # nor a step without a time
    assert cost.means.keys() == {2, 4}
    assert cost.value == 0.2


def test_rows_that_measure_as_cheaper_than_none_are_read_as_free():
    cost = RowCost(0.2)
    for _ in range(MIN_STEPS):
        cost.observe(1, 0.010)
        cost.observe(4, 0.009)  # a little less for more rows (noise): a price of 0, not a negative one
    assert cost.value == 0.0


def test_a_price_that_stopped_proposals_goes_stale_and_the_prior_returns():
    """Priced too high, no step has more rows than the batch, so that price would never be measured
    again: once the other row counts are stale, the start value is used and proposals are tried."""
    cost = RowCost(0.2)
    steps(cost, rho=0.7, t1=0.01, rows=range(1, 5), rounds=20)
    assert cost.value == pytest.approx(0.7)
    steps(cost, rho=0.7, t1=0.01, rows=range(1, 2), rounds=STALE_STEPS - 1)
    assert cost.value == pytest.approx(0.7)  # rows 2-4 last seen within the window
    steps(cost, rho=0.7, t1=0.01, rows=range(1, 2), rounds=3)
    assert cost.value == 0.2
