"""Ray restarts of a service actor follow the local supervisor's RestartPolicy."""

from __future__ import annotations

from pagedserve.ops.deploy.process_group import RestartPolicy
from pagedserve.ops.deploy.ray_restarts import RestartLedger, next_start

POLICY = RestartPolicy(backoff_s=0.5, max_backoff_s=4.0, max_restarts_per_minute=3, stable_after_s=30.0)


def test_the_first_start_waits_for_nothing() -> None:
    plan = next_start(None, now=100.0, policy=POLICY)

    assert plan.delay_s == 0.0
    assert plan.ledger == RestartLedger(started_at=100.0)


def test_quick_deaths_back_off_exponentially_up_to_the_cap() -> None:
    ledger, delays, now = next_start(None, 0.0, POLICY).ledger, [], 0.0
    for _ in range(3):
        now += 1.0
        plan = next_start(ledger, now, POLICY)
        delays.append(plan.delay_s)
        ledger = plan.ledger
        now += plan.delay_s

    assert delays == [0.5, 1.0, 2.0]
    assert ledger.total_restarts == 3


def test_a_run_longer_than_stable_after_starts_the_backoff_over() -> None:
    ledger = RestartLedger(started_at=0.0, consecutive_failures=4, total_restarts=4)

    plan = next_start(ledger, now=31.0, policy=POLICY)

    assert plan.delay_s == 0.5
    assert plan.ledger.consecutive_failures == 1


def test_more_restarts_in_a_minute_than_the_policy_allows_give_up() -> None:
    ledger = RestartLedger(started_at=50.0, consecutive_failures=3, recent_restarts=[10.0, 20.0, 40.0])

    assert next_start(ledger, now=55.0, policy=POLICY).delay_s is None
    assert next_start(ledger, now=75.0, policy=POLICY).delay_s is not None  # 10.0 left the window


def test_the_ledger_survives_a_round_trip_through_the_gcs() -> None:
    ledger = RestartLedger(started_at=1.5, consecutive_failures=2, recent_restarts=[1.0], total_restarts=7)

    assert RestartLedger.from_json(ledger.to_json()) == ledger
