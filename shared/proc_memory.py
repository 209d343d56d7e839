"""A process's memory as Linux reports it in /proc/PID/status: its `Name: N kB` lines (VmRSS, VmHWM,
RssAnon, RssFile, RssShmem, ...), for the ops views, the worker's start log and the benchmarks."""

from __future__ import annotations

from pathlib import Path


def memory_kib(pid: int | str = "self") -> dict[str, int]:
    """Every kB line of /proc/PID/status -> {name: KiB}; {} where there is no such file (not Linux, or
    the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields = value.split()
        if len(fields) == 2 and fields[1] == "kB":
            found[name] = int(fields[0])
    return found


def resident_bytes(pid: int | str = "self") -> int | None:
    """The process's resident memory (VmRSS) in bytes; None where /proc does not say."""
    kib = memory_kib(pid).get("VmRSS")
    return None if kib is None else kib * 1024
