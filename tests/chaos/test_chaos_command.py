"""`pagedserve chaos`: its own deployment under faults of every kind (worker SIGKILL, short and long
SIGSTOP/SIGCONT, scheduler and block-manager SIGKILL) loses no request, changes no output, breaks
no stream and leaks no block; and the way it finds the processes of a running deployment in /proc."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pagedserve.ops.chaos import command as chaos
from pagedserve.ops.chaos.targets import ProcessWorkers, is_worker_command


@pytest.fixture(scope="module")
def report(tiny_model, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("chaos") / "chaos.json"
    code = chaos.main(
        [
            "--start",
            "3",
            "--model",
            str(tiny_model("llama")),
            "--num-blocks",
            "256",
            "--duration",
            "45",
            "--fault-every",
            "3",
            "--concurrency",
            "8",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    report["exit_code"] = code
    report["png"] = out.with_suffix(".png")
    return report


def test_no_request_is_lost_under_faults(report):
    assert report["requests"]["sent"] > 0
    assert report["requests"]["lost"] == 0, report["requests"]["lost_detail"]
    assert report["requests"]["finished"] > 0


def test_every_kind_of_fault_is_injected(report):
    injected = {kind for kind, k in report["by_kind"].items() if k["count"]}
    expected = {
        "worker_kill",
        "worker_pause_short",
        "worker_pause_long",
        "scheduler_kill",
        "block_manager_kill",
    }
    assert expected <= injected, report["by_kind"]
    # The API server joins when the deployment runs one; otherwise it is reported, not silently dropped.
    assert "api_kill" in injected or report["faults_unavailable"] == ["api_kill"]


def test_every_output_equals_the_fault_free_reference(report):
    out = report["outputs"]
    assert out["checked_against_reference"]
    assert out["compared"] == report["requests"]["finished"] > 0
    assert out["wrong"] == 0, out["wrong_ids"]


def test_requests_through_the_http_api_are_judged_like_the_rest(report):
    # A quarter of the lanes stream through the OpenAI API; the API kill then breaks real streams,
    # which are re-sent (as a client retries) and must still give the reference text.
    req, out = report["requests"], report["outputs"]
    assert report["settings"]["api_lanes"] == 2
    assert req["via_api"] > 0 and out["compared_via_api"] > 0
    assert req["api_interrupted"] <= report["by_kind"]["api_kill"]["count"] * report["settings"]["api_lanes"]


def test_no_stream_duplicates_or_misses_a_token(report):
    out = report["outputs"]
    assert (out["duplicated_stream_tokens"], out["missing_stream_tokens"], out["streams_broken"]) == (0, 0, 0)
    assert out["stream_text_mismatch"] == 0


def test_no_request_errors_while_a_worker_is_ready(report):
    assert report["outputs"]["errored_while_workers_ready"] == 0, report["outputs"]


def test_long_pauses_are_noticed_and_short_ones_pass_unseen(report):
    kinds = report["by_kind"]
    assert kinds["worker_pause_long"]["noticed"] == kinds["worker_pause_long"]["count"]
    assert kinds["worker_pause_short"]["noticed"] == 0, report["faults"]
    for fault in report["faults"]:
        assert fault["recovered_after_s"] is not None, fault


def test_the_timeline_has_samples_and_restarts(report):
    timeline = report["timeline"]
    assert len(timeline["samples"]) >= 45 and timeline["columns"][0] == "t_s"
    assert {name for _, name in timeline["restarts"]} >= {"scheduler", "block-manager"}
    assert report["png"].stat().st_size > 10_000


def test_no_block_leaks_and_the_invariants_hold(report):
    assert report["blocks"]["leaked"] == 0
    assert report["blocks"]["invariants_ok"], report["blocks"]["violations"]
    assert report["blocks"]["whole"], report["blocks"]["pools"]
    assert len(report["blocks"]["pools"]) == 3


def test_every_worker_death_is_noticed_within_2_s(report):
    kills = [f for f in report["faults"] if f["kind"] == "worker_kill"]
    assert kills
    for kill in kills:
        assert kill["noticed_after_s"] is not None and kill["noticed_after_s"] <= 2.0, kill


def test_a_clean_run_exits_0(report):
    assert report["ok"], report["failures"]
    assert report["exit_code"] == 0


def test_worker_command_lines_are_recognised():
    assert is_worker_command(
        ["/usr/bin/python3", "-m", "pagedserve.ops.cli", "worker", "--worker-id", "worker-0"]
    )
    assert is_worker_command(["/venv/bin/python3", "/venv/bin/pagedserve", "worker"])
    assert is_worker_command(["pagedserve", "worker"])
    assert not is_worker_command(["/venv/bin/python3", "/venv/bin/pagedserve", "chaos", "worker"])
    assert not is_worker_command(["python", "-m", "pagedserve.ops.cli", "scheduler"])
    assert not is_worker_command(["python", "worker.py", "worker"])


def test_only_workers_of_our_front_endpoint_are_victims():
    ours, theirs = "tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002"
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)", "-m", "pagedserve.ops.cli"]
    started = [
        # A child of `pagedserve up`: its id as a flag, the whole config in its environment.
        subprocess.Popen(
            [*sleeper, "worker", "--worker-id", "worker-0"], env={"PAGEDSERVE_FRONT_ENDPOINT": ours}
        ),
        # Someone else's deployment on the same machine.
        subprocess.Popen(
            [*sleeper, "worker", "--worker-id", "worker-0"], env={"PAGEDSERVE_FRONT_ENDPOINT": theirs}
        ),
        # Ours, started by hand without an id: named host-pid, a name its restart will not keep.
        subprocess.Popen([*sleeper, "worker", "--front-endpoint", ours], env={}),
        subprocess.Popen([*sleeper, "scheduler"], env={"PAGEDSERVE_FRONT_ENDPOINT": ours}),
    ]
    try:
        victims = sorted(ProcessWorkers(ours).victims(), key=lambda v: v.pid or 0)
        assert [(v.pid, v.worker_id, v.stable_id) for v in victims] == [
            (started[0].pid, "worker-0", True),
            (started[2].pid, f"{socket.gethostname()}-{started[2].pid}", False),
        ]
        # The scheduler of our front endpoint is a target too (its own chaos fault).
        assert ProcessWorkers(ours).services() == {"scheduler": started[3].pid}
    finally:
        for p in started:
            p.send_signal(signal.SIGKILL)
            p.wait()


def test_attach_without_a_deployment_says_how_to_get_one(capsys):
    code = chaos.main(["--scheduler-ops", "http://127.0.0.1:9", "--duration", "1", "--out", "/dev/null"])
    assert code == 2
    assert "pagedserve up --workers 3" in capsys.readouterr().err


def test_the_cli_dispatches_to_chaos(capsys):
    from pagedserve.ops.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["chaos", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert "--fault-every" in help_text and "worker_pause_long" in help_text


def test_json_default_lives_beside_the_benchmarks():
    assert chaos.parse_args([]).out == Path("bench/results/chaos.json")
