"""Peak resident memory of a server's processes while a benchmark runs, sampled every 0.5 s.

    python -m pagedserve.ops.bench.rss_peaks ROOT_PID LLAMA_SERVER_PORT OUT.json &
    ... run the load ...; kill %1     # SIGTERM writes {"<pid> <command line>": {"rss_mib": ...}}

Each process's peak RSS, with its parts at that peak (anonymous, file-backed, shared memory: a
worker's K/V pool is shared memory, its copied weights anonymous, so the parts say what the peak was
made of), all in MiB.

Watches ROOT_PID and every process under it (`pagedserve serve`: API, scheduler, block manager,
workers), and any llama-server listening on LLAMA_SERVER_PORT (started by `bench serve --peer-llamacpp`).
Reads /proc only (Linux).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from pagedserve.ops.results import portable
from pagedserve.shared.proc_memory import memory_kib


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, from each process's parent in /proc/*/stat (/proc/PID/task/*/children
    is missing on kernels built without CONFIG_PROC_CHILDREN: the first run here saw no workers)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def command(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()


PARTS = {"rss_mib": "VmRSS", "anon_mib": "RssAnon", "file_mib": "RssFile", "shmem_mib": "RssShmem"}


def rss_parts(pid: int) -> dict[str, float] | None:
    """The process's RSS and its parts in MiB; None once it has exited."""
    kib = memory_kib(pid)
    if any(field not in kib for field in PARTS.values()):
        return None
    return {name: round(kib[field] / 1024, 1) for name, field in PARTS.items()}


def watched(root: int, port: str) -> list[int]:
    pids = [root, *descendants(root)]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = command(int(entry))
            except OSError:
                continue
            if "llama-server" in cmd and f"--port {port}" in cmd:
                pids.append(int(entry))
    return pids


def main() -> None:
    root, port, out = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    peaks: dict[str, dict[str, float]] = {}

    def stop(*_: object) -> None:
        out.write_text(json.dumps(portable(peaks), indent=1))  # its keys are command lines
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        for pid in watched(root, port):
            try:
                key, parts = f"{pid} {command(pid)[:200]}", rss_parts(pid)
            except OSError:
                continue  # exited between the listing and the read
            if parts is not None and parts["rss_mib"] > peaks.get(key, {}).get("rss_mib", -1.0):
                peaks[key] = parts
        time.sleep(0.5)


if __name__ == "__main__":
    main()
