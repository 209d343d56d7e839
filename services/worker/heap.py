"""A worker's process keeps the heap its steps grow, instead of returning it to the kernel after each.

glibc's malloc maps a buffer above its mmap threshold afresh on every allocation and trims the top of
the heap once more than its trim threshold is free there (both thresholds move up with use, to 32 MB
and 64 MB at most). A prefill step allocates buffers of that size many times a layer (the MoE experts'
gathered rows and outputs: 32 MiB each at a 2048-token chunk), so every step faulted the same memory
in again, page by page: a 1B MoE's 2048-token chunks took ~200K minor faults a step on an AMD EPYC Zen 3. With both
thresholds at 1 GB and the heap grown 64 MB at a time, freed memory is reused: 2048-token prefills ran
~10% faster (faults 1.2M -> 0.37M over four steps; docs/cpu-performance.md). The cost is memory: what
a step frees stays resident, and big buffers now share the heap with small ones, so its holes are
not always reused. A served 64-request run of that MoE peaked at 1,721 MB of worker RSS against
1,557 without (+164 MB, the K/V pool's 655 MB included in both). The setting is the process's: an
`LLM` on the CPU sets it in its caller's process too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

import structlog

_M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
KEEP_BYTES = 1 << 30  # no buffer below this is mapped afresh, no free heap below this is trimmed
GROW_BYTES = 64 << 20  # how much more the heap grows than an allocation asks for

_kept = False


def on_glibc() -> bool:
    """Whether this process's C library is glibc, whose mallopt these settings are (musl, macOS: not)."""
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):  # a platform without that confstr name
        return False


def keep_freed_heap() -> bool:
    """Set this process's malloc to keep freed memory (once; glibc only). Returns whether it is set."""
    global _kept
    if _kept:
        return True
    if not on_glibc():
        return False  # another allocator is left as it is
    mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    settings = ((_M_MMAP_THRESHOLD, KEEP_BYTES), (_M_TRIM_THRESHOLD, KEEP_BYTES), (_M_TOP_PAD, GROW_BYTES))
    _kept = all(mallopt(option, value) == 1 for option, value in settings)
    if not _kept:
        structlog.get_logger().warning("heap_settings_refused", allocator="glibc")
    return _kept
