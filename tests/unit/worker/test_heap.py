"""The worker's process keeps freed heap memory: a step's large buffers are not faulted in again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pagedserve.services.worker.heap import on_glibc

# Allocates, fills and frees a 48 MB buffer (above glibc's largest automatic mmap threshold) a few
# times and prints the minor page faults of the last round; "keep" sets the worker's heap first.
ROUNDS = """
import resource, sys, torch
from pagedserve.services.worker.heap import keep_freed_heap
if sys.argv[1] == "keep":
    assert keep_freed_heap()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    before = faults()
    buffer = torch.ones(12 * 1024 * 1024)
    del buffer
print(faults() - before)
"""

# mallopt and its options are glibc's: under another C library the worker leaves the allocator as it is.
needs_glibc = pytest.mark.skipif(not on_glibc(), reason="no glibc here: keep_freed_heap changes nothing")


def _last_round_faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


@needs_glibc
def test_a_freed_large_buffer_is_reused_without_faulting_it_in_again() -> None:
    pages = 48 * 1024 * 1024 // os.sysconf("SC_PAGE_SIZE")
    assert _last_round_faults("default") > pages // 2  # the control: glibc maps it afresh each time
    assert _last_round_faults("keep") < pages // 20
