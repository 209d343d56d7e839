"""The chaos report's count of HTTP streams at each API kill: open, broken by it, and went on."""

from __future__ import annotations

from pagedserve.ops.chaos.faults import Fault
from pagedserve.ops.chaos.load import LoadOutcome, RequestRecord
from pagedserve.ops.chaos.report import api_kill_survival


def api_kill(at: float) -> Fault:
    return Fault("api_kill", "api", None, True, 123, at, 1)


def stream(rid: str, started: float, ended: float | None, broken_at: list[float] = ()) -> RequestRecord:
    record = RequestRecord(rid, "p", started, ended=ended, via="api")
    record.interrupted_at = list(broken_at)
    return record


def test_streams_open_at_a_kill_are_split_into_broken_and_survived():
    load = LoadOutcome()
    load.records = [
        stream("broken", 0.0, 20.0, broken_at=[10.1]),
        stream("survived", 1.0, 30.0),
        stream("ended-before", 0.0, 9.0),
        stream("started-after", 11.0, 15.0),
        stream("sdk", 0.0, 30.0),
    ]
    load.records[-1].via = "sdk"
    assert api_kill_survival(load, [api_kill(10.0)]) == {
        "streams_open": 2,
        "streams_broken": 1,
        "streams_survived": 1,
    }


def test_a_break_long_after_the_kill_is_not_the_kills_doing():
    load = LoadOutcome()
    load.records = [stream("later", 0.0, 40.0, broken_at=[25.0])]
    assert api_kill_survival(load, [api_kill(10.0)])["streams_broken"] == 0
    assert api_kill_survival(load, [api_kill(24.0)])["streams_broken"] == 1
