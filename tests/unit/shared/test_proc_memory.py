"""A process's memory from /proc/PID/status: this process's own lines, and none for one that is gone."""

from __future__ import annotations

import subprocess
import sys

from pagedserve.shared.proc_memory import memory_kib, resident_bytes


def test_this_process_reports_its_resident_memory_and_its_parts() -> None:
    kib = memory_kib()
    assert kib["VmRSS"] > 0 and kib["VmHWM"] >= kib["VmRSS"]
    assert kib["RssAnon"] + kib["RssFile"] + kib["RssShmem"] == kib["VmRSS"]
    assert resident_bytes() is not None and resident_bytes() > 10 << 20  # an interpreter with pytest


def test_a_process_that_is_gone_reports_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert memory_kib(child.pid) == {}
    assert resident_bytes(child.pid) is None
