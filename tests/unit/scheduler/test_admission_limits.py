"""Admission limits: a request that can never fit its worker's pool, and the per-client book."""

from __future__ import annotations

import pytest

from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.services.scheduler.admission import RequestRejected
from pagedserve.services.scheduler.clients import ClientBook
from pagedserve.services.scheduler.outputs import RequestDone
from pagedserve.services.scheduler.scheduler import Scheduler, SchedulerLimits
from pagedserve.shared.protocol.frontend import SamplingParams


def test_a_request_larger_than_the_whole_pool_ends_too_large_for_pool_and_does_not_wedge_the_queue():
    bm = BlockManager(lease_ttl_s=100.0)
    bm.add_pool("w0", 4, 8)  # 32 slots
    sched = Scheduler(SchedulerLimits(max_model_len=4096), eos_token_ids=[0])
    sched.add_worker("w0", 4, 8)
    sched.add_request("huge", list(range(1, 40)), SamplingParams(max_tokens=2), 0.0)
    sched.add_request("small", [1, 2, 3], SamplingParams(max_tokens=2), 0.0)
    plan = sched.schedule("w0", 0.0)
    events = sched.take_rejected()
    assert [(e.request_id, e.error_code) for e in events if isinstance(e, RequestDone)] == [
        ("huge", "too_large_for_pool")
    ]
    # The small one behind it is admitted in the same step.
    ex = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
    assert [r.request_id for r in ex.new_requests] == ["small"]
    assert not sched.is_live("huge") and sched.take_rejected() == []


def test_a_prompt_that_just_fits_the_pool_alone_is_admitted():
    sched = Scheduler(SchedulerLimits(max_model_len=4096), eos_token_ids=[0])
    sched.add_worker("w0", 4, 8)
    sched.add_request("fits", list(range(1, 32)), SamplingParams(max_tokens=1), 0.0)  # 31 + 1 = 32 slots
    plan = sched.schedule("w0", 0.0)
    assert sched.take_rejected() == [] and [e.request.request_id for e in plan.entries] == ["fits"]


def test_the_book_refuses_a_client_past_its_limit_naming_it():
    book = ClientBook(max_inflight=2)
    book.admit(b"c1", "a", stream=True)
    book.admit(b"c1", "b", stream=False)
    with pytest.raises(RequestRejected, match="max_inflight_per_client=2") as info:
        book.admit(b"c1", "c", stream=True)
    assert info.value.code == "too_many_requests"
    book.admit(b"c2", "c", stream=True)  # the limit is per client


def test_done_frees_a_slot_and_returns_the_route():
    book = ClientBook(max_inflight=1)
    book.admit(b"c1", "a", stream=True)
    assert book.done("a") == b"c1"
    assert book.done("a") is None
    book.admit(b"c1", "b", stream=True)
    assert book.live == {b"c1": {"b"}}


def test_reroute_moves_a_request_to_the_reconnected_client():
    book = ClientBook(max_inflight=4)
    book.admit(b"old", "a", stream=False)
    book.reroute(b"new", "a", stream=True)
    assert book.route["a"] == b"new" and book.streaming["a"] is True
    assert book.live[b"new"] == {"a"} and book.live[b"old"] == set()


def test_lapsed_lists_only_silent_clients_with_live_requests():
    book = ClientBook(max_inflight=4)
    book.seen(b"quiet", 0.0)
    book.admit(b"quiet", "q1", stream=True)
    book.seen(b"chatty", 0.0)
    book.admit(b"chatty", "c1", stream=True)
    book.seen(b"idle", 0.0)  # no requests: never lapsed
    book.seen(b"chatty", 9.0)
    assert book.lapsed(now=11.0, timeout_s=10.0) == [(b"quiet", ["q1"])]
