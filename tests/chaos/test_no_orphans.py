"""No orphans: `pagedserve up` SIGKILLed while one of its workers is SIGSTOPped leaves nothing of
the deployment behind: no process (by pid, and by a /proc scan for its config), no bound port.
A stopped worker never runs a SIGTERM handler, so the parent-death signal must be one it cannot
hold pending (SIGKILL); before, such a worker outlived its supervisor for hours."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness.deployment import free_ports, get_json, wait_for


def deployment_processes(marker: str) -> list[int]:
    """Live processes whose environment names this deployment's front endpoint."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() not in (entry / "environ").read_bytes():
                continue
            state = next(
                line for line in (entry / "status").read_text().splitlines() if line.startswith("State:")
            )
        except (OSError, StopIteration):
            continue  # gone meanwhile, or not ours to read
        if "Z" not in state.split()[1]:  # a zombie holds no port and runs nothing
            found.append(int(entry.name))
    return found


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_killed_supervisor_leaves_no_process_even_with_a_worker_stopped(tiny_model, tmp_path):
    front, workers, bm, sched_ops, bm_ops = ports = free_ports(5)
    marker = f"tcp://127.0.0.1:{front}"
    env = os.environ | {"PAGEDSERVE_LOG_FORMAT": "json", "PAGEDSERVE_NUM_THREADS": "1"}
    up = subprocess.Popen(
        [
            sys.executable, "-m", "pagedserve.ops.cli", "up", "--no-api", "--workers", "2",
            "--model", str(tiny_model("llama")), "--num-blocks", "64", "--log-dir", str(tmp_path),
            "--front-endpoint", marker, "--worker-endpoint", f"tcp://127.0.0.1:{workers}",
            "--block-manager-endpoint", f"tcp://127.0.0.1:{bm}",
            "--scheduler-ops-port", str(sched_ops), "--block-manager-ops-port", str(bm_ops),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def ready() -> bool:
            try:
                return len(get_json(f"http://127.0.0.1:{sched_ops}/readyz")["workers"]) == 2
            except Exception:
                return False

        assert wait_for(ready, 120), "the deployment never became ready"
        children = [int(p) for p in subprocess.check_output(["pgrep", "-P", str(up.pid)], text=True).split()]
        assert len(children) == 4  # block manager, scheduler, two workers
        assert set(children) <= set(deployment_processes(marker))
        worker = next(p for p in children if b"\0worker\0" in Path(f"/proc/{p}/cmdline").read_bytes())
        os.kill(worker, signal.SIGSTOP)
        assert wait_for(lambda: "(stopped)" in Path(f"/proc/{worker}/status").read_text(), 5)
        up.kill()
        up.wait()
        time.sleep(10.0)
        assert deployment_processes(marker) == []
        assert [pid for pid in children if pid in deployment_processes(marker)] == []
        assert all(port_free(p) for p in ports), [p for p in ports if not port_free(p)]
    finally:
        up.kill()
        up.wait()
        for pid in deployment_processes(marker):  # never leave one behind, even when the test fails
            os.kill(pid, signal.SIGKILL)
