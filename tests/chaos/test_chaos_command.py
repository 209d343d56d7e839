"""`pagedserve chaos`: its own deployment under kills loses no request and leaks no block; and the
way it finds worker processes of a running deployment in /proc."""

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
            "--duration",
            "15",
            "--kill-every",
            "4",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    report["exit_code"] = code
    return report


def test_no_request_is_lost_under_kills(report):
    assert report["requests"]["sent"] > 0
    assert report["requests"]["lost"] == 0, report["requests"]["lost_ids"]
    assert report["requests"]["finished"] > 0


def test_no_block_leaks_and_the_invariants_hold(report):
    assert report["blocks"]["leaked"] == 0
    assert report["blocks"]["invariants_ok"], report["blocks"]["violations"]
    assert report["blocks"]["whole"], report["blocks"]["pools"]
    assert len(report["blocks"]["pools"]) == 3


def test_workers_are_killed_and_every_death_is_noticed_within_2_s(report):
    kills = report["kills"]
    assert len(kills) >= 2, kills
    for kill in kills:
        assert kill["detected_after_s"] is not None and kill["detected_after_s"] <= 2.0, kill
        assert kill["whole_after_s"] is not None, kill


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
    assert "--kill-every" in capsys.readouterr().out


def test_json_default_lives_beside_the_benchmarks():
    assert chaos.parse_args([]).out == Path("bench/results/chaos.json")
