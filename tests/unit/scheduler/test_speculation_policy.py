"""The lookahead a decode is granted: the cost model backs off with the batch, acceptance sets the length."""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.request import Request
from pagedserve.services.scheduler.speculation import SpeculationPolicy
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.speculative_config import SpeculativeConfig


def decode(
    acceptance: float, max_tokens: int = 100, speculate: bool = True, own_cap: int | None = None
) -> Request:
    sampling = SamplingParams(max_tokens=max_tokens, speculate=speculate, num_speculative_tokens=own_cap)
    req = Request("r", [1, 2, 3], sampling, 0.0, "w")
    req.output_token_ids = [4]
    req.num_slots_used = 3
    req.spec_acceptance = req.spec_continuation = acceptance  # p_j = acceptance^j
    return req


def policy(**config) -> SpeculationPolicy:
    return SpeculationPolicy(SpeculativeConfig(num_speculative_tokens=8, **config), max_model_len=4096)


def test_one_request_with_good_acceptance_gets_the_run_whose_last_token_still_pays():
    p = policy(row_cost=0.2)
    req = decode(0.75)
    # 0.75, 0.56, 0.42 beat what the step already makes per row (0.2, 0.29, 0.33); 0.32 < 0.34 does not.
    assert p.grant([req]) == {id(req): 3}


def test_a_batch_of_sixteen_gets_proposals_only_for_near_certain_runs():
    p = policy(row_cost=0.2, max_step_rows=64)
    middling = [decode(0.7) for _ in range(15)]
    certain = decode(0.97)
    granted = p.grant([*middling, certain])
    assert set(granted) == {id(certain)}  # 0.7 never beats the 0.8 a 16-row step already makes
    assert granted[id(certain)] == 6


def test_proposals_go_round_by_round_so_equal_requests_share_the_rows():
    p = policy(row_cost=0.0, max_step_rows=10)
    reqs = [decode(0.9) for _ in range(4)]
    assert sorted(p.grant(reqs).values()) == [1, 1, 2, 2]  # 4 decodes + 6 proposals = 10 rows


def test_a_request_granted_nothing_drifts_back_toward_trying_again():
    p = policy(row_cost=0.2)
    req = decode(0.1)
    for _ in range(200):
        if p.grant([req]):
            break
    assert req.spec_acceptance > 0.2 and p.grant([req])


def test_lookahead_stops_at_max_tokens_and_respects_the_off_switches():
    p = policy(row_cost=0.0)
    near_end = decode(0.9, max_tokens=3)  # one output so far, this step gives one: one more at most
    assert p.grant([near_end]) == {id(near_end): 1}
    assert p.grant([decode(0.9, speculate=False)]) == {}
    cut = policy(row_cost=0.0, disable_by_batch_size=2)
    assert cut.grant([decode(0.9), decode(0.9)]) == {}
    capped = policy(row_cost=0.0, max_step_rows=6)
    granted = capped.grant([decode(0.9), decode(0.8)])
    assert sum(granted.values()) == 4  # 6 rows: two decodes and four proposals


def test_a_request_caps_its_own_lookahead_below_the_deployments_never_above():
    p = policy(row_cost=0.0)
    assert list(p.grant([decode(0.99, own_cap=2)]).values()) == [2]
    assert p.grant([decode(0.99, own_cap=0)]) == {}
    assert list(p.grant([decode(0.99, own_cap=16)]).values()) == [8]  # the deployment's 8 stays the cap


def test_a_null_row_cost_prices_proposals_at_what_the_steps_measured():
    """`row_cost: null`, the price is learned (row_cost.py): cheap rows earn a request more proposals
    than dear ones, at the same acceptance."""
    cheap, dear = policy(row_cost=None), policy(row_cost=None)
    for rows in range(1, 8):
        for _ in range(5):
            cheap.learned.observe(rows, 0.008 * (1 + 0.05 * (rows - 1)))
            dear.learned.observe(rows, 0.008 * (1 + 0.6 * (rows - 1)))
    assert cheap.row_cost == pytest.approx(0.05) and dear.row_cost == pytest.approx(0.6)
    req = decode(0.65)
    # 0.65^j against what the step already makes per unit of time: rho 0.05 grants 0.65 ... 0.12 (the
    # sixth, 0.075, is below 0.05 x 2.64 / 1.25), rho 0.6 only the first (0.42 < 0.6 x 1.65 / 1.6)
    assert cheap.grant([req]) == {id(req): 5}
    assert dear.grant([req]) == {id(req): 1}
    assert policy(row_cost=0.6).row_cost == 0.6  # a configured price is kept whatever the steps say


def test_a_request_whose_proposals_are_accepted_in_runs_gets_long_runs():
    """Acceptance in runs (all of a proposal or none, as when text copies its context) prices later
    proposals by how often they follow an accepted one, not by the average over every token: the same
    half of the tokens accepted, spread evenly, earns two."""
    p = policy(row_cost=0.2)
    runs, spread = decode(0.6), decode(0.6)
    for _ in range(20):
        for accepted in (4, 0):  # all four or none: alpha -> 0.5, beta -> 1
            SpeculationPolicy.on_outcome(runs, 4, 4, accepted)
        SpeculationPolicy.on_outcome(spread, 4, 4, 2)  # two of four every time: alpha -> 1, beta -> 0.5
    assert runs.num_accepted / runs.num_proposed == spread.num_accepted / spread.num_proposed == 0.5
    assert runs.spec_continuation == pytest.approx(1.0, abs=0.01)
    assert spread.spec_continuation == pytest.approx(0.5, abs=0.01)
    # p_j 0.5 beats 0.2 x tokens / (1 + 0.2 x (rows - 1)) up to the cap of 8; 1, 0.5, 0.25 stops at two
    assert p.grant([runs]) == {id(runs): 8}
    assert p.grant([spread]) == {id(spread): 2}
