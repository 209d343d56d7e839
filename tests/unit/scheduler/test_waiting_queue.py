"""WaitingQueue: explicit priority, tenants in turn (FCFS each) within a level, aging lifts a long wait
one level per aging_s."""

from __future__ import annotations

from pagedserve.services.scheduler.request import Request
from pagedserve.services.scheduler.waiting import WaitingQueue
from pagedserve.shared.protocol.frontend import SamplingParams


def request(rid: str, arrival: float, priority: int = 0, tenant: str = "") -> Request:
    return Request(rid, [1, 2], SamplingParams(priority=priority), arrival, "w0", tenant=tenant)


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


def test_a_flooding_tenant_does_not_hold_back_another_tenants_request():
    queue = WaitingQueue(aging_s=5.0)
    for i in range(50):
        queue.push(request(f"alice-{i}", i * 0.01, tenant="alice"))
    queue.push(request("bob-0", 1.0, tenant="bob"))
    order = drain(queue, now=1.0)
    assert order.index("bob-0") == 1  # after alice's oldest, not after all 50
    assert [r for r in order if r.startswith("alice")] == [f"alice-{i}" for i in range(50)]


def test_a_tenant_arriving_late_goes_before_tenants_already_served():
    queue = WaitingQueue(aging_s=5.0)
    for i in range(5):
        queue.push(request(f"alice-{i}", float(i), tenant="alice"))
    queue.pop(queue.peek(5.0))  # alice-0 admitted
    queue.pop(queue.peek(5.0))  # alice-1 admitted: nobody else was waiting
    queue.push(request("bob-0", 6.0, tenant="bob"))
    assert drain(queue, now=7.0)[0] == "bob-0"


def test_tenants_take_turns_each_in_arrival_order():
    queue = WaitingQueue(aging_s=5.0)
    for i, (rid, tenant) in enumerate(
        [("a0", "a"), ("a1", "a"), ("a2", "a"), ("b0", "b"), ("c0", "c"), ("b1", "b")]
    ):
        queue.push(request(rid, float(i), tenant=tenant))
    assert drain(queue, now=6.0) == ["a0", "b0", "c0", "a1", "b1", "a2"]


def test_a_preempted_request_goes_first_even_with_other_tenants_waiting():
    queue = WaitingQueue(aging_s=5.0)
    queue.push(request("a1", 1.0, tenant="a"))
    queue.push(request("b1", 2.0, tenant="b"))
    queue.push_front(request("b0", 0.0, tenant="b"))
    assert drain(queue, now=3.0) == ["b0", "a1", "b1"]


def test_removing_a_tenants_last_request_drops_it_from_the_turns():
    queue = WaitingQueue(aging_s=5.0)
    gone = request("b0", 1.0, tenant="b")
    queue.push(request("a0", 0.0, tenant="a"))
    queue.push(gone)
    queue.push(request("a1", 2.0, tenant="a"))
    assert queue.remove(gone) and not queue.remove(gone)
    assert len(queue) == 2
    assert drain(queue, now=3.0) == ["a0", "a1"]
