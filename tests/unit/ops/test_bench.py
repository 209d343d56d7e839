"""`pagedserve bench`: its workload, its accounting of static batches, and one tiny end-to-end run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pagedserve.ops.bench.command import main, parse_args
from pagedserve.ops.bench.peers import PathResult
from pagedserve.ops.bench.report import build_report
from pagedserve.ops.bench.services import parse_metrics
from pagedserve.ops.bench.workload import (
    Workload,
    make_workload,
    max_len_utilization,
    static_batch_accounting,
    static_batches,
)


def test_workload_is_the_same_for_the_same_seed() -> None:
    assert make_workload(32, 1000, seed=7) == make_workload(32, 1000, seed=7)
    assert make_workload(32, 1000, seed=7) != make_workload(32, 1000, seed=8)


def test_workload_lengths_and_token_ids_are_within_bounds() -> None:
    w = make_workload(200, 320, seed=0, min_len=16, max_len=64)
    assert len(w) == 200
    assert all(16 <= len(p) <= 64 for p in w.prompts)
    assert all(16 <= n <= 64 for n in w.output_lens)
    assert all(0 <= t < 320 for p in w.prompts for t in p)
    # Uniform, not constant: both ends of the range show up in 200 draws.
    assert min(w.output_lens) < 24 and max(w.output_lens) > 56


def test_workload_rejects_empty_ranges() -> None:
    with pytest.raises(ValueError, match="min_len"):
        make_workload(4, 320, min_len=64, max_len=16)


def test_static_batches_keep_arrival_order_and_a_short_last_batch() -> None:
    assert static_batches(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]


def test_static_batch_accounting_counts_only_each_requests_own_tokens() -> None:
    w = Workload(prompts=[[0] * 10, [0] * 20, [0] * 30], output_lens=[5, 50, 10], seed=0)
    acc = static_batch_accounting(w, batch_size=2)
    assert acc.own_output_tokens == 5 + 50 + 10
    assert acc.decoded_tokens == 2 * 50 + 1 * 10  # the first batch runs both rows to 50
    # batch 1: (10+20 prompt + 5+50 output) / (2 rows x (20 + 50)); batch 2 holds exactly its tokens
    assert acc.kv_utilization == pytest.approx((85 / 140 + 1.0) / 2)


def test_max_len_preallocation_utilization_is_tokens_over_max_len() -> None:
    w = Workload(prompts=[[0] * 10, [0] * 30], output_lens=[10, 50], seed=0)
    assert max_len_utilization(w, 100) == pytest.approx((20 + 80) / 200)


def test_quick_shrinks_the_workload_and_the_batch_sizes() -> None:
    args = parse_args(["--quick"])
    assert (args.num_requests, args.min_len, args.max_len, args.hf_batch_sizes) == (16, 16, 64, [8, 16])
    assert parse_args([]).hf_batch_sizes == [8, 16, 32, 64]


def test_services_are_compared_against_an_in_process_run() -> None:
    assert "pagedserve" in parse_args(["--peers", "hf-static", "--services"]).peers


def test_speedup_target_compares_against_the_best_transformers_path() -> None:
    paths = [
        PathResult("pagedserve", 300, 1.0, details={"kv_utilization": 0.97}),
        PathResult("hf-static bs=8", 300, 3.0, details={"kv_utilization": 0.5}),
        PathResult("hf-static bs=16", 300, 2.0, details={"kv_utilization": 0.4}),
        PathResult("hf-continuous", error="RuntimeError: no CPU kernel"),
    ]
    report = build_report(
        config={},
        workload={},
        paths=paths,
        services=[],
        max_len_kv={"max_model_len": 512, "kv_utilization": 0.3},
    )
    assert report["best_hf"] == "hf-static bs=16"
    assert report["targets"]["speedup"] == {"value": pytest.approx(2.0), "target": 2.0, "met": True}
    assert report["targets"]["kv_utilization"]["met"]


def test_worker_idle_and_step_counters_are_read_from_the_metrics_page() -> None:
    from prometheus_client import generate_latest

    from pagedserve.services.scheduler.metrics import SchedulerMetrics

    m = SchedulerMetrics()
    m.worker_idle.labels("worker-0").inc(0.25)
    m.step_time.observe(0.5)
    m.step_time.observe(1.5)
    got = parse_metrics(generate_latest(m.registry).decode())
    assert got == {
        "pagedserve_worker_idle_seconds_total": 0.25,
        "pagedserve_step_seconds_sum": 2.0,
        "pagedserve_step_seconds_count": 2.0,
    }


def test_quick_run_on_a_tiny_model_writes_json_with_every_path_and_a_chart(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    rc = main(
        [
            "--model",
            str(tiny_model("llama")),
            "--quick",
            "--num-requests",
            "4",
            "--max-len",
            "24",
            "--threads",
            "1",
            "--kv-cache-memory",
            "4MiB",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    rows = {r["name"]: r for r in report["paths"]}
    assert set(rows) == {"pagedserve", "hf-static bs=8", "hf-static bs=16", "hf-continuous"}
    wanted = report["workload"]["output_tokens"]
    for name in ("pagedserve", "hf-static bs=8", "hf-static bs=16"):
        assert rows[name]["error"] is None
        assert rows[name]["output_tokens"] == wanted  # EOS ignored; static counts own tokens only
    # transformers' continuous batching either ran or says why it could not, on this machine.
    assert rows["hf-continuous"]["error"] is not None or rows["hf-continuous"]["output_tokens"] == wanted
    assert 0 < report["kv_utilization"]["pagedserve"] <= 1
    assert report["efficiency"]["ceiling_flop_per_s"] > 0 and rows["pagedserve"]["ceiling_fraction"] > 0
    assert report["machine"]["cores"] >= 1 and report["machine"]["torch"]
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_services_run_on_a_tiny_model_reports_throughput_and_worker_idle(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    argv = ["--model", str(tiny_model("llama")), "--quick", "--num-requests", "2", "--max-len", "16"]
    argv += ["--threads", "1", "--kv-cache-memory", "4MiB", "--peers", "pagedserve", "--services"]
    assert main([*argv, "--depths", "2", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["services"]
    assert row["error"] is None and row["pipeline_depth"] == 2
    assert row["output_tokens"] > 0 and row["steps"] > 0
    assert 0 <= row["idle_fraction"] < 1 and row["services_over_in_process"] > 0


def test_emulated_avx2_run_tells_every_library_and_says_it_is_emulation(
    tiny_model: Callable[..., Path], tmp_path: Path
) -> None:
    """`--emulate-isa avx2` in a fresh process (the environment must be set before torch loads): our
    kernels, ATen and oneDNN/MKL stop at AVX2, and the report says so."""
    import os
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    argv = ["--model", str(tiny_model("llama")), "--quick", "--num-requests", "2", "--max-len", "16"]
    argv += ["--threads", "1", "--kv-cache-memory", "4MiB", "--peers", "pagedserve", "--emulate-isa", "avx2"]
    env = {k: v for k, v in os.environ.items() if k not in ("PAGEDSERVE_CPU_ISA", "ATEN_CPU_CAPABILITY")}
    code = "import sys; from pagedserve.ops.bench.command import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, *argv, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["config"]["emulate_isa"] == "avx2"
    assert report["config"]["emulation_environment"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert "emulation" in report["config"]["emulation_note"]
    machine = report["machine"]
    assert machine["kernel_isa"] == "avx2" and machine["aten_cpu_capability"] == "AVX2"
    assert set(machine["kernel_paths"].values()) <= {"avx2", "torch"}
    (row,) = report["paths"]
    assert row["error"] is None and row["output_tokens"] == report["workload"]["output_tokens"]


def test_emulating_a_path_this_cpu_cannot_run_is_refused(monkeypatch) -> None:
    from pagedserve.ops.bench import emulation

    monkeypatch.setattr(emulation, "check_isa", lambda isa: (_ for _ in ()).throw(ValueError("lacks avx2")))
    with pytest.raises(ValueError, match="lacks avx2"):
        emulation.emulate_isa("avx2")
    with pytest.raises(ValueError, match="must be one of"):
        emulation.emulate_isa("avx512")
