"""The step timeout follows measured step times: floor, factor x p99, cap; a hang threshold below it."""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.liveness import WorkerLiveness
from pagedserve.services.scheduler.step_clock import REFRESH_EVERY, StepClock
from pagedserve.shared.protocol.control import Heartbeat


def clock() -> StepClock:
    return StepClock(floor_s=10.0, factor=20.0, cap_s=60.0, dump_factor=10.0, min_samples=16)


def test_an_unmeasured_worker_gets_the_cap():
    c = clock()
    for _ in range(15):
        c.observe("w", 0.05)
    assert c.timeout_s("w") == 60.0 and c.p99("w") is None


def test_fast_steps_get_the_floor_and_slow_ones_factor_times_p99():
    c = clock()
    for _ in range(100):
        c.observe("fast", 0.05)
        c.observe("slow", 0.7)
    assert c.timeout_s("fast") == 10.0  # 20 x 50 ms = 1 s, under the floor
    assert c.timeout_s("slow") == 14.0  # 20 x 700 ms
    assert c.dump_after_s("fast") == 5.0  # half the floor
    assert c.dump_after_s("slow") == 7.0  # 10 x 700 ms: stacks are dumped before the timeout fires


def test_the_p99_is_of_recent_steps_and_the_cap_holds():
    c = clock()
    for _ in range(256):
        c.observe("w", 10.0)
    assert c.timeout_s("w") == 60.0  # 20 x 10 s = 200 s, capped
    for _ in range(256):
        c.observe("w", 0.2)  # the window forgets the slow past
    assert c.timeout_s("w") == 10.0


def test_liveness_declares_a_step_lost_at_its_measured_timeout_and_suspects_it_first():
    c = clock()
    for _ in range(50):
        c.observe("w0", 0.1)
    live = WorkerLiveness(heartbeat_interval_s=0.5, worker_timeout_s=1.5, steps=c)
    live.heard(Heartbeat("w0", "inc", 64, 16, 100), now=0.0, step_socket=True)
    sent = {"w0": 0.0}

    def beat(t: float) -> None:
        live.links["w0"].last_heartbeat = t  # its heartbeats keep coming: only the step is stuck

    beat(4.9)
    assert live.suspected_hangs(4.9, sent.get) == [] and live.overdue(4.9, sent.get) == []
    beat(5.1)
    assert live.suspected_hangs(5.1, sent.get) == ["w0"]
    assert live.suspected_hangs(5.2, sent.get) == []  # once per step
    beat(10.1)
    assert live.overdue(10.1, sent.get) == [("w0", "step unanswered for 10.1s")]


def test_the_p99_is_computed_again_every_few_steps_not_every_step():
    """A scheduler asks for the p99 on every step; it is computed again once REFRESH_EVERY steps came in."""
    c = StepClock(floor_s=1.0, factor=4.0, cap_s=60.0, min_samples=16, window=64)
    for _ in range(64):
        c.observe("w", 0.1)
    assert c.p99("w") == pytest.approx(0.1)
    for _ in range(REFRESH_EVERY - 1):
        c.observe("w", 5.0)  # slow steps, not yet looked at again
    assert c.p99("w") == pytest.approx(0.1)
    c.observe("w", 5.0)
    assert c.p99("w") == pytest.approx(5.0)
