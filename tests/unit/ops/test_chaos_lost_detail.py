"""What the chaos report says about each lost request: what the client saw, and what the scheduler's
/requests held for it at the drain deadline (its status and worker), so a lost request can be hunted."""

from __future__ import annotations

from pagedserve.ops.chaos.load import LoadOutcome, LoadSettings, RequestRecord, describe_lost
from pagedserve.ops.chaos.watch import scheduler_requests
from pagedserve.shared.ops_server import OpsServer, json_response

HELD = {"request_id": "sdk-held", "status": "running", "worker_id": "worker-1", "output_tokens": 7}


def outcome() -> LoadOutcome:
    load = LoadOutcome()
    load.records = [
        RequestRecord("sdk-held", "p", 0.0, streamed_tokens=[1, 2, 3]),
        RequestRecord("sdk-gone", "p", 0.0),
        RequestRecord("api-0", "p", 0.0, via="api", interrupted_at=[4.0]),
        RequestRecord("done", "p", 0.0, ended=3.0),
    ]
    load.lost_ids = ["api-0", "sdk-gone", "sdk-held"]
    return load


def test_each_lost_request_carries_the_schedulers_record_or_its_absence():
    asked: list[bool] = []

    def view() -> dict[str, dict]:
        asked.append(True)
        return {"sdk-held": HELD}

    details = describe_lost(outcome(), LoadSettings("tcp://x", scheduler_view=view))
    assert asked == [True]  # once for all of them
    by_id = {d["request_id"]: d for d in details}
    assert list(by_id) == ["api-0", "sdk-gone", "sdk-held"]
    assert by_id["sdk-held"]["scheduler"] == HELD and by_id["sdk-held"]["streamed_tokens"] == 3
    assert by_id["sdk-gone"]["scheduler"] is None and by_id["sdk-gone"]["scheduler_answered"]
    # The API names its own requests to the scheduler: no lookup by our id, its breaks counted instead.
    assert "scheduler" not in by_id["api-0"] and by_id["api-0"]["api_interruptions"] == 1


def test_a_silent_scheduler_is_said_so_not_taken_for_an_empty_one():
    details = describe_lost(outcome(), LoadSettings("tcp://x", scheduler_view=lambda: None))
    sdk = [d for d in details if d["via"] == "sdk"]
    assert sdk and all(d["scheduler_answered"] is False and d["scheduler"] is None for d in sdk)


def test_scheduler_requests_reads_the_ops_route_over_http():
    view = {"requests": [HELD], "waiting": 0, "running": 1}
    server = OpsServer("127.0.0.1", 0, {"/requests": lambda: json_response(view)}).start()
    try:
        assert scheduler_requests(f"http://127.0.0.1:{server.port}") == {"sdk-held": HELD}
    finally:
        server.stop()
    assert scheduler_requests(f"http://127.0.0.1:{server.port}") is None  # nobody answers now
