"""The worker's process keeps freed heap memory: a step's large buffers are not faulted in again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pagedserve.services.worker.heap import on_glibc

# Allocates, fills and frees a 48 MB buffer (above glibc's largest automatic mmap threshold) eight
# times and prints the minor page faults of the last four rounds; "keep" sets the worker's heap first.
# A kept heap may still fault the buffer in during the first three rounds: torch asks for an aligned
# buffer (a little more than the chunk a freed one leaves), and a small object Python allocates after
# it pins that chunk apart from the heap's top, so a new buffer is carved past it until two freed
# chunks merge (seen in rounds 2 and 3, in varying order, Zen 3). A step's buffers meet the same.
ROUNDS = """
import resource, sys, torch
from pagedserve.services.worker.heap import keep_freed_heap
if sys.argv[1] == "keep":
    assert keep_freed_heap()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for round in range(8):
    if round == 4:
        before = faults()
    buffer = torch.ones(12 * 1024 * 1024)
    del buffer
print(faults() - before)
"""

# mallopt and its options are glibc's: under another C library the worker leaves the allocator as it is.
needs_glibc = pytest.mark.skipif(not on_glibc(), reason="no glibc here: keep_freed_heap changes nothing")


def _last_rounds_faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


@needs_glibc
def test_a_freed_large_buffer_is_reused_without_faulting_it_in_again() -> None:
    pages = 48 * 1024 * 1024 // os.sysconf("SC_PAGE_SIZE")
    assert _last_rounds_faults("default") > 2 * pages  # the control: glibc maps it afresh each time
    assert _last_rounds_faults("keep") < pages // 20


# Keeps the heap, frees a 48 MB buffer that a small one after it pins in the middle of the heap (so
# glibc's own top trim could not return it), and prints the resident anonymous KiB it gave back.
RELEASE = """
import sys, torch
from pagedserve.services.worker.heap import keep_freed_heap, release_freed_heap
assert keep_freed_heap()
def anon_kib():
    status = open("/proc/self/status").read()
    return int(status.split("RssAnon:")[1].split()[0])
buffer = torch.ones(12 * 1024 * 1024)
pin = torch.ones(1024)
del buffer
before = anon_kib()
if sys.argv[1] == "release":
    release_freed_heap()
print(before - anon_kib())
"""


def _kib_given_back(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", RELEASE, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


@needs_glibc
def test_a_kept_heap_hands_its_free_pages_back_when_released() -> None:
    assert _kib_given_back("keep") < 4 * 1024  # the control: a kept heap holds the freed buffer
    assert _kib_given_back("release") > 40 * 1024
