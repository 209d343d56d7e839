"""Named failpoints: off unless armed, chains of counted terms, refusals that name the mistake."""

from __future__ import annotations

import pytest

from pagedserve.shared import failpoints


@pytest.fixture(autouse=True)
def disarmed():
    failpoints.configure(None)
    yield
    failpoints.configure(None)


def test_an_unarmed_point_does_nothing():
    assert not failpoints.fire("worker.drop_execute")
    assert failpoints.armed() == []


def test_a_counted_chain_fires_on_the_hit_it_names_then_turns_off():
    failpoints.configure("worker.drop_execute=2*off->1*return")
    assert [failpoints.fire("worker.drop_execute") for _ in range(5)] == [False, False, True, False, False]


def test_an_uncounted_term_fires_forever_and_other_points_stay_off():
    failpoints.configure("worker.drop_execute=return")
    assert all(failpoints.fire("worker.drop_execute") for _ in range(10))
    assert not failpoints.fire("worker.delay_reply")


def test_sleep_blocks_the_caller_and_does_not_skip_its_work(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(failpoints.time, "sleep", slept.append)  # the clock of the code, not the wall
    failpoints.configure("worker.delay_reply=1*sleep(200)")
    assert not failpoints.fire("worker.delay_reply")
    assert slept == [0.2]
    assert not failpoints.fire("worker.delay_reply") and slept == [0.2]  # counted: once


def test_a_probability_of_zero_never_fires_but_still_counts():
    failpoints.configure("worker.drop_execute=0%3*return->1*return")
    assert [failpoints.fire("worker.drop_execute") for _ in range(4)] == [False, False, False, True]


def test_panic_raises_at_the_point():
    failpoints.configure("worker.delay_reply=panic(boom)")
    with pytest.raises(failpoints.FailpointPanic, match="boom"):
        failpoints.fire("worker.delay_reply")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("worker.drop_exec=return", "unknown failpoint 'worker.drop_exec'"),
        ("worker.drop_execute", "expected name=action"),
        ("worker.drop_execute=explode", "bad term 'explode'"),
        ("worker.delay_reply=sleep(soon)", "sleep needs milliseconds"),
        ("worker.delay_reply=150%return", "outside 0-100"),
    ],
)
def test_a_bad_spec_is_refused_naming_what_is_wrong(spec, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        failpoints.configure(spec)
    assert failpoints.armed() == []
