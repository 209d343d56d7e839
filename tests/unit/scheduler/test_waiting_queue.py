"""WaitingQueue: explicit priority, FCFS within a level, aging lifts a long wait one level per aging_s."""

from __future__ import annotations

from pagedserve.services.scheduler.request import Request
from pagedserve.services.scheduler.waiting import WaitingQueue
from pagedserve.shared.protocol.frontend import SamplingParams


def request(rid: str, arrival: float, priority: int = 0) -> Request:
    return Request(rid, [1, 2], SamplingParams(priority=priority), arrival, "w0")


def drain(queue: WaitingQueue, now: float) -> list[str]:
    order = []
    while (head := queue.peek(now)) is not None:
        queue.pop(head)
        order.append(head.request_id)
    return order


def test_same_priority_is_first_come_first_served():
    queue = WaitingQueue(aging_s=5.0)
    for i in range(4):
        queue.push(request(f"r{i}", float(i)))
    assert drain(queue, now=4.0) == ["r0", "r1", "r2", "r3"]


def test_higher_priority_goes_first_while_nobody_has_aged():
    queue = WaitingQueue(aging_s=5.0)
    queue.push(request("low", 0.0, priority=0))
    queue.push(request("high", 1.0, priority=1))
    assert drain(queue, now=2.0) == ["high", "low"]


def test_a_request_waiting_aging_s_per_level_overtakes_a_newer_higher_one():
    queue = WaitingQueue(aging_s=5.0)
    queue.push(request("old-low", 0.0, priority=0))
    queue.push(request("new-high", 9.0, priority=1))
    # At 10 s the old one has aged two levels (0 + 2 > 1).
    assert queue.peek(10.0).request_id == "old-low"
    # At 5 s it has aged one level: a tie, broken by the earlier arrival.
    assert queue.peek(5.0).request_id == "old-low"
    # Before 5 s it has not aged at all.
    assert queue.peek(4.9).request_id == "new-high"


def test_aging_off_keeps_strict_fifo_across_levels():
    queue = WaitingQueue(aging_s=0.0)
    queue.push(request("first", 0.0, priority=0))
    queue.push(request("second", 1.0, priority=5))
    assert drain(queue, now=100.0) == ["first", "second"]


def test_push_front_puts_a_preempted_request_ahead_of_its_level():
    queue = WaitingQueue(aging_s=5.0)
    queue.push(request("waiting", 1.0))
    queue.push_front(request("preempted", 2.0))
    assert drain(queue, now=2.0) == ["preempted", "waiting"]


def test_remove_takes_a_request_out_of_the_middle_and_counts_it():
    queue = WaitingQueue(aging_s=5.0)
    reqs = [request(f"r{i}", float(i)) for i in range(3)]
    for r in reqs:
        queue.push(r)
    assert queue.remove(reqs[1]) is True
    assert queue.remove(reqs[1]) is False
    assert len(queue) == 2
    assert drain(queue, now=3.0) == ["r0", "r2"]
    assert len(queue) == 0
