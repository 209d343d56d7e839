"""No orphans: `pagedserve up` SIGKILLed while one of its workers is SIGSTOPped leaves nothing of
the deployment behind: no process (by pid, and by a /proc scan for its config), no bound port, no
KV segment in shared memory. A stopped worker never runs a SIGTERM handler, so the parent-death
signal must be one it cannot hold pending (SIGKILL); before, such a worker outlived its supervisor
for hours. The segments' folder is removed by the supervisor when it stops, and by its sweeper
process when it is SIGKILLed (ops/deploy/kv_segments.py)."""

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


def start_up(
    model: Path, log_dir: Path, workers: int, *extra: str
) -> tuple[subprocess.Popen[bytes], str, list[int]]:
    front, worker_port, bm, sched_ops, bm_ops = ports = free_ports(5)
    marker = f"tcp://127.0.0.1:{front}"
    env = os.environ | {"PAGEDSERVE_LOG_FORMAT": "json", "PAGEDSERVE_NUM_THREADS": "1"}
    up = subprocess.Popen(
        [
            sys.executable, "-m", "pagedserve.ops.cli", "up", "--no-api", "--workers", str(workers),
            "--model", str(model), "--num-blocks", "64", "--log-dir", str(log_dir),
            "--front-endpoint", marker, "--worker-endpoint", f"tcp://127.0.0.1:{worker_port}",
            "--block-manager-endpoint", f"tcp://127.0.0.1:{bm}",
            "--scheduler-ops-port", str(sched_ops), "--block-manager-ops-port", str(bm_ops), *extra,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def ready() -> bool:
        try:
            return len(get_json(f"http://127.0.0.1:{sched_ops}/readyz")["workers"]) == workers
        except Exception:
            return False

    if not wait_for(ready, 120):
        up.kill()
        up.wait()
        raise AssertionError("the deployment never became ready")
    return up, marker, ports


def segment_folders(up_pid: int) -> list[Path]:
    """The KV segments' folders of the `up` with this pid (pagedserve-kv-<pid>-<random>)."""
    return [p for p in Path("/dev/shm").glob(f"pagedserve-kv-{up_pid}-*") if p.is_dir()]


def test_a_killed_supervisor_leaves_no_process_even_with_a_worker_stopped(tiny_model, tmp_path):
    up, marker, ports = start_up(tiny_model("llama"), tmp_path, 2)
    try:
        children = [int(p) for p in subprocess.check_output(["pgrep", "-P", str(up.pid)], text=True).split()]
        services = set(deployment_processes(marker))
        # block manager, scheduler, two workers, the standby worker; and the segments' sweeper,
        # which holds no config: it only waits to remove the folder
        assert len(services) == 5 and services <= set(children) and len(children) == 6
        folders = segment_folders(up.pid)
        assert len(folders) == 1 and sorted(p.name for p in folders[0].iterdir()) == [
            "worker-0.kv",
            "worker-1.kv",
        ]
        worker = next(p for p in children if b"\0--worker-id\0" in Path(f"/proc/{p}/cmdline").read_bytes())
        os.kill(worker, signal.SIGSTOP)
        assert wait_for(lambda: "(stopped)" in Path(f"/proc/{worker}/status").read_text(), 5)
        up.kill()
        up.wait()
        time.sleep(10.0)
        assert deployment_processes(marker) == []
        assert [pid for pid in children if pid in deployment_processes(marker)] == []
        assert all(port_free(p) for p in ports), [p for p in ports if not port_free(p)]
        assert segment_folders(up.pid) == []  # the sweeper removed what the dead supervisor could not
    finally:
        up.kill()
        up.wait()
        for pid in deployment_processes(marker):  # never leave one behind, even when the test fails
            os.kill(pid, signal.SIGKILL)


def test_a_stopped_deployment_leaves_no_kv_segment(tiny_model, tmp_path):
    up, marker, _ports = start_up(tiny_model("llama"), tmp_path, 1, "--standby-workers", "0")
    try:
        assert [p.name for p in segment_folders(up.pid)[0].iterdir()] == ["worker-0.kv"]
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=60) == 0
        assert segment_folders(up.pid) == [] and deployment_processes(marker) == []
    finally:
        up.kill()
        up.wait()
        for pid in deployment_processes(marker):
            os.kill(pid, signal.SIGKILL)
