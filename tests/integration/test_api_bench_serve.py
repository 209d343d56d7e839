"""`pagedserve bench serve` against a local deployment: every request done, the figures and files there."""

from __future__ import annotations

import json
import subprocess
import sys

from harness.deployment import get_text
from prometheus_client.parser import text_string_to_metric_families


def completions_answered(deployment) -> float:
    """The API's count of /v1/completions answered 200, from its /metrics."""
    text = get_text(deployment.api.base_url.removesuffix("/v1") + "/metrics")
    answered = {"route": "/v1/completions", "status": "200"}
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "pagedserve_api_requests"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels == answered
    )


def test_bench_serve_measures_a_local_deployment_at_two_rates(api_deployment, tmp_path):
    out = tmp_path / "serve.json"
    argv = [
        sys.executable, "-m", "pagedserve.ops.cli", "bench", "serve",
        "--base-url", api_deployment.api.base_url, "--api-key", api_deployment.api_key,
        "--num-prompts", "6", "--input-len", "16", "--output-len", "8",
        "--request-rate", "4,inf", "--max-concurrency", "4", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    answered = completions_answered(api_deployment)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    # One warm-up request first (untimed, uncounted in the runs), then both rates' 6.
    assert report["warmups"] == 1
    assert completions_answered(api_deployment) - answered == 1 + 2 * 6
    assert report["model"] == api_deployment.model_name
    assert [r["request_rate"] for r in report["runs"]] == [4.0, "inf"]
    for run in report["runs"]:
        assert (run["completed"], run["failed"]) == (6, 0)
        assert run["total_output_tokens"] == 48 and run["total_input_tokens"] == 96
        assert 0 < run["ttft_ms"]["p50"] <= run["ttft_ms"]["p99"] <= run["e2e_ms"]["p99"]
        assert run["tpot_ms"]["mean"] > 0 and run["itl_ms"]["p90"] > 0
        assert run["output_throughput"] > 0
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "TTFT (ms)" in done.stdout


def test_bench_serve_names_an_unreachable_server(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pagedserve.ops.cli", "bench", "serve", "--base-url", "http://127.0.0.1:9/v1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "http://127.0.0.1:9/v1/models" in done.stderr
