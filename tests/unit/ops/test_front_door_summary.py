"""The front-door load's verdict: a hung request, an error other than 429/503, or a slow ops probe fails it."""

from __future__ import annotations

from types import SimpleNamespace

from pagedserve.ops.bench.front_door import summarize

ARGS = SimpleNamespace(clients=2, duration=1.0, max_tokens=4, stream_fraction=0.5)


def rec(end: str, ttft: float | None = 0.1, e2e: float = 0.5) -> dict:
    return {"end": end, "ttft_s": ttft, "e2e_s": e2e, "stream": True, "at": 0.0}


def test_ok_and_refusals_pass_and_are_counted():
    report = summarize(
        [rec("ok"), rec("ok", e2e=1.0), rec("429"), rec("503")], {"ops": [[1, "u", 0.2, True]]}, ARGS
    )
    assert report["passed"] and report["rejected_429"] == 1 and report["unavailable_503"] == 1
    assert report["e2e_s"]["p50"] == 0.75 and report["other_errors"] == 0


def test_a_hung_request_an_other_error_or_a_slow_ops_probe_fails_it():
    ops_ok = {"ops": [[1, "u", 0.2, True]]}
    assert not summarize([rec("ok"), rec("hung")], ops_ok, ARGS)["passed"]
    assert not summarize([rec("ok"), rec("500")], ops_ok, ARGS)["passed"]
    assert not summarize([rec("ok")], {"ops": [[1, "u", 1.5, True]]}, ARGS)["passed"]
