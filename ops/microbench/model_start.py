"""How long a deployment takes to start on a model, the first time and again, and a worker restart.

    /work/tools/cpulock bench .venv/bin/python ops/microbench/model_start.py [--model smollm2-135m]

Runs `pagedserve up --workers 1 --no-api` three ways, each in a fresh process tree:
  first start   an empty model cache (`PAGEDSERVE_CACHE` a new folder; the compiled kernels linked in
                from the usual cache, so no compile is timed): whatever a first start derives
  warm start    the same cache again: what every later start costs
  worker restart  the worker SIGKILLed, `up` restarts it: from the new worker process's appearance to
                its `worker_started` log line (its imports, the model load, the pool registration;
                the supervisor's backoff before it is not counted), three times, the median

Times are wall seconds from `up`'s start to its "ready in" line. Only the standard library is
imported here, so any checkout's venv can run it (`/path/to/venv/bin/python ops/microbench/model_start.py`
times that venv's pagedserve): a before/after comparison runs the same script on both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pagedserve.shared.config import add_config_flag


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def worker_pid(up: int) -> int | None:
    for pid in children(up):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in args:
            return pid
    return None


class Deployment:
    def __init__(self, model: str, cache: Path, logs: Path, threads: int) -> None:
        front, workers, bm, sched_ops, bm_ops = free_ports(5)
        argv = [
            sys.executable, "-m", "pagedserve.ops.cli", "up", "--workers", "1", "--no-api",
            "--model", model, "--num-threads", str(threads), "--log-dir", str(logs), "--log-format", "json",
            "--front-endpoint", f"tcp://127.0.0.1:{front}", "--worker-endpoint", f"tcp://127.0.0.1:{workers}",
            "--block-manager-endpoint", f"tcp://127.0.0.1:{bm}",
            "--scheduler-ops-port", str(sched_ops), "--block-manager-ops-port", str(bm_ops),
            "--ready-timeout", "900",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEDSERVE_")}
        env["PAGEDSERVE_CACHE"] = str(cache)
        self.logs = logs
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)

    def wait_ready(self) -> float:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("ready in"):
                return time.monotonic() - self.started
        raise RuntimeError(f"up exited ({self.proc.wait()}) before it was ready; logs in {self.logs}")

    def worker_started_count(self) -> int:
        log = self.logs / "worker-0.log"
        if not log.is_file():
            return 0
        return sum('"worker_started"' in line for line in log.read_text(errors="replace").splitlines())

    def restart_worker(self) -> float:
        """SIGKILL the worker; seconds from its successor's process start to its worker_started line."""
        old = worker_pid(self.proc.pid)
        assert old is not None, "no worker process"
        count = self.worker_started_count()
        os.kill(old, signal.SIGKILL)
        new, appeared = None, 0.0
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            pid = worker_pid(self.proc.pid)
            if new is None and pid not in (None, old):
                new, appeared = pid, time.monotonic()
            if new is not None and self.worker_started_count() > count:
                return time.monotonic() - appeared
            time.sleep(0.05)
        raise RuntimeError(f"the worker did not come back; logs in {self.logs}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_flag(parser, "model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--kernels", type=Path, default=Path("~/.cache/pagedserve/kernels").expanduser())
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pagedserve-model-start-"))
    cache = root / "cache"
    cache.mkdir()
    if args.kernels.is_dir():
        (cache / "kernels").symlink_to(args.kernels)
    result: dict[str, object] = {"model": args.model, "python": sys.executable}
    try:
        first = Deployment(args.model, cache, root / "logs-first", args.threads)
        try:
            result["first_start_s"] = round(first.wait_ready(), 2)
        finally:
            first.stop()
        warm = Deployment(args.model, cache, root / "logs-warm", args.threads)
        try:
            result["warm_start_s"] = round(warm.wait_ready(), 2)
            restarts = []
            for _ in range(args.restarts):
                restarts.append(round(warm.restart_worker(), 2))
                time.sleep(2)  # the scheduler re-admits it; the next kill finds it serving
            result["worker_restart_s"] = restarts
            result["worker_restart_median_s"] = statistics.median(restarts)
        finally:
            warm.stop()
        written = sorted(
            str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file() and "kernels" not in p.parts
        )
        result["cache_files_written"] = written
        result["cache_bytes_written"] = sum((cache / p).stat().st_size for p in written)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
