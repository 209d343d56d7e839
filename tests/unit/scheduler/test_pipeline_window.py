"""PipelineWindow: at most `depth` steps in flight, answered in order."""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.pipeline import PipelineWindow


def test_window_has_room_until_depth_steps_are_open():
    window = PipelineWindow(depth=2)
    assert window.has_room()
    window.open(["a"], now=0.0)
    assert window.has_room()
    window.open(["a"], now=0.1)
    assert not window.has_room() and len(window) == 2


def test_step_numbers_rise_from_next_step_and_never_repeat():
    window = PipelineWindow(depth=3, next_step=1 << 32)
    first = window.open(["a"], now=0.0)
    window.close(first)
    assert window.open(["a"], now=0.1) == first + 1


def test_close_returns_the_oldest_step_with_its_requests():
    window = PipelineWindow(depth=2)
    s0 = window.open(["a", "b"], now=0.0)
    window.open(["a"], now=0.5)
    closed = window.close(s0)
    assert closed.step == s0 and closed.request_ids == ["a", "b"]
    assert window.oldest_sent_at() == 0.5


def test_a_result_out_of_order_is_refused_naming_the_expected_step():
    window = PipelineWindow(depth=2)
    s0 = window.open(["a"], now=0.0)
    s1 = window.open(["a"], now=0.1)
    with pytest.raises(ValueError, match=f"expected step {s0}"):
        window.close(s1)
    assert len(window) == 2  # nothing was taken


def test_an_empty_window_has_no_oldest_step_and_refuses_any_result():
    window = PipelineWindow(depth=1)
    assert window.oldest_sent_at() is None
    with pytest.raises(ValueError, match="expected step None"):
        window.close(0)
