"""A service's own pause is not its peers' silence (shared/pauses.py), by the clock of the test."""

from __future__ import annotations

from pytest import approx

from pagedserve.shared.pauses import PAUSE_SLACK_S, AwakeSince


def test_silence_counts_from_the_end_of_a_pause_of_our_own():
    awake = AwakeSince()
    for now in (10.0, 10.05, 10.2):  # turns as long as the poll may wait, and a little work
        awake.turn(now, 0.1)
    assert awake.silence(10.2, last_heard=9.0) == approx(1.2)
    awake.turn(13.0, 0.1)  # a turn of 2.8 s: we did not run
    assert awake.silence(13.0, last_heard=10.1) == 0.0
    assert awake.silence(13.5, last_heard=10.1) == approx(0.5)
    assert awake.silence(13.5, last_heard=13.2) == approx(0.3)  # heard after the pause: as before


def test_a_turn_just_within_the_slack_is_no_pause():
    awake = AwakeSince()
    awake.turn(0.0, 0.1)
    awake.turn(0.1 + PAUSE_SLACK_S - 0.01, 0.1)
    assert awake.silence(2.0, last_heard=0.0) == 2.0
