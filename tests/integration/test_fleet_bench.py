"""`pagedserve bench fleet` at small sizes: simulated workers (real processes, no model) register,
are driven by one scheduler, and every number of the report is there."""

from __future__ import annotations

import json

from pagedserve.ops.bench import command as bench


def test_fleet_of_one_and_two_simulated_workers_is_measured(tmp_path):
    out = tmp_path / "fleet.json"
    code = bench.main(
        ["fleet", "--sizes", "1,2", "--warmup", "1", "--measure", "2", "--per-worker", "4", "--out", str(out)]
    )
    assert code == 0
    report = json.loads(out.read_text())
    rows = report["fleets"]
    assert [r["workers"] for r in rows] == [1, 2]
    for row in rows:
        assert row["steps"] > 0 and row["requests_finished"] > 0, row
        # A simulated step is 10 ms: one worker cannot exceed 100 steps/s.
        assert 0 < row["steps_per_s_per_worker"] <= 110, row
        assert 0.0 <= row["worker_idle"] < 1.0
        assert row["scheduler_cpu_per_step_ms"] > 0 and row["bm_cpu_per_batch_ms"] is not None
    under = [r["workers"] for r in rows if r["worker_idle"] < report["idle_target"]]
    assert report["largest_fleet_under_idle_target"] == (max(under) if under else None)
