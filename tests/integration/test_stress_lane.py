"""`pagedserve chaos stress` as a user runs it, on a toy test file instead of the services' tests:
it tells a round that workers are being killed, and stopping the lane stops its round and hogs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from pagedserve.ops.chaos.stress import KILLS_ENV, descendants


def lane(tmp_path: Path, test_body: str, *extra: str) -> subprocess.Popen[bytes]:
    toy = tmp_path / "test_toy.py"
    toy.write_text(test_body)
    cmd = [
        sys.executable,
        "-m",
        "pagedserve.ops.cli",
        "chaos",
        "stress",
        "--tests",
        str(toy),
        "--out",
        str(tmp_path / "out"),
    ]
    return subprocess.Popen([*cmd, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_a_round_with_worker_kills_is_told_so_and_one_without_is_not(tmp_path):
    body = f"import os\ndef test_env():\n    assert os.environ.get({KILLS_ENV!r}) == '30.0'\n"
    killed = lane(tmp_path, body, "--minutes", "0.001", "--hogs", "0", "--kill-worker-every", "30")
    assert killed.wait(timeout=120) == 0, killed.stdout.read().decode()
    report = json.loads((tmp_path / "out" / "stress-report.json").read_text())
    assert report["rounds"] == 1 and report["failures"] == 0
    plain = lane(tmp_path, body, "--minutes", "0.001", "--hogs", "0")
    assert plain.wait(timeout=120) == 1  # the same test fails when nothing is being killed


def test_sigterm_stops_the_lane_its_round_and_its_hogs(tmp_path):
    proc = lane(
        tmp_path, "import time\ndef test_long():\n    time.sleep(300)\n", "--minutes", "5", "--hogs", "1"
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(b"test_toy" in cmdline(p) for p in descendants(proc.pid)):
        time.sleep(0.2)
    below = descendants(proc.pid)
    assert any(b"test_toy" in cmdline(p) for p in below), "the round never started"
    assert any(b"stress-ng" in cmdline(p) or b"while True" in cmdline(p) for p in below), "no hog started"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    time.sleep(0.5)
    left = [p for p in below if alive(p)]
    assert not left, [cmdline(p) for p in left]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
