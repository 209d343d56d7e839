"""A worker's process keeps the heap its steps grow while a step runs, and hands it back after a big one.

glibc's malloc maps a buffer above its mmap threshold afresh on every allocation and trims the top of
the heap once more than its trim threshold is free there (both thresholds move up with use, to 32 MB
and 64 MB at most). A prefill step allocates buffers of that size many times a layer (the MoE experts'
gathered rows and outputs: 32 MiB each at a 2048-token chunk), so every layer faulted the same memory
in again: a 1B MoE's 2048-token chunks took 160-360K minor faults a step (AMD EPYC Zen 3). With both
thresholds at 1 GB and the heap grown 64 MB at a time, freed memory is reused: ~35K faults a step,
and prefills ran ~10% faster in the first two alternated rounds (a later set of three could not tell
them apart on that VM; docs/cpu-performance.md).

Kept for good, that memory costs: a served 64-request run of that MoE (128 tokens in, 32 out) peaked
at 1,637-1,644 MiB of worker RSS against 1,492-1,543 without, since big buffers share the heap with
small ones and its holes are not always reused. So the runner hands the free heap back after each
step of `RELEASE_AFTER_ROWS` rows or more (`release_freed_heap`, glibc's malloc_trim). A step still
reuses its buffers from layer to layer and faults them in once (~80K faults a 2048-token step), and
the same run peaked at 1,497-1,531 MiB (the K/V pool's 640 MiB in every figure). The setting is the
process's: an `LLM` on the CPU sets it in its caller's process too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

import structlog

_M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
KEEP_BYTES = 1 << 30  # no buffer below this is mapped afresh, no free heap below this is trimmed
GROW_BYTES = 64 << 20  # how much more the heap grows than an allocation asks for
# A step of fewer rows frees too little to be worth a trim, which walks the whole heap: 3-4 ms after a
# 128-token prompt of the 1B MoE, 15-28 ms after a 2048-token chunk (~5.5 s of work), Zen 3.
RELEASE_AFTER_ROWS = 512

_kept = False


def on_glibc() -> bool:
    """Whether this process's C library is glibc, whose mallopt these settings are (musl, macOS: not)."""
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):  # a platform without that confstr name
        return False


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"))


def keep_freed_heap() -> bool:
    """Set this process's malloc to keep freed memory (once; glibc only). Returns whether it is set."""
    global _kept
    if _kept:
        return True
    if not on_glibc():
        return False  # another allocator is left as it is
    mallopt = _libc().mallopt
    settings = ((_M_MMAP_THRESHOLD, KEEP_BYTES), (_M_TRIM_THRESHOLD, KEEP_BYTES), (_M_TOP_PAD, GROW_BYTES))
    _kept = all(mallopt(option, value) == 1 for option, value in settings)
    if not _kept:
        structlog.get_logger().warning("heap_settings_refused", allocator="glibc")
    return _kept


def release_freed_heap() -> None:
    """Hand the heap's free pages back to the kernel, where `keep_freed_heap` is set (else glibc trims
    as it goes). Between steps, not within one: what a kept heap frees, and the holes big buffers leave
    in it, would otherwise stay resident for good (~140 MiB more at the peak of the served MoE run)."""
    if _kept:
        _libc().malloc_trim(0)
