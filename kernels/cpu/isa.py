"""Which instruction-set path of the C++ kernels this CPU runs, and the compiler flags of each path.

Every kernel source builds three ways: `avx512` (AVX-512 F/BW/VL/DQ, plus AVX512-BF16 where the CPU
has it), `avx2` (AVX2 + FMA + F16C) and `portable` (no ISA flag at all: whatever the compiler's
baseline is, x86-64 SSE2 or ARM64 NEON). The sources are written over ATen's `at::vec::Vectorized`,
whose width and instructions follow the CPU_CAPABILITY macros set here, so one source is all three.

A CPU runs every path at or below its best: an AVX-512 machine runs the AVX2 and portable code too,
which is how each path is tested on one machine. `PAGEDSERVE_CPU_ISA=avx512|avx2|portable` forces
a path (tests, benchmarks, `--emulate-isa`); forcing one this CPU cannot execute is refused, since
it would die of SIGILL on its first vector instruction.
"""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path

ISAS = ("avx512", "avx2", "portable")  # best first
ISA_ENV = "PAGEDSERVE_CPU_ISA"

# What each x86 path needs from /proc/cpuinfo's flags (Linux's names).
REQUIRED_FLAGS: dict[str, frozenset[str]] = {
    "avx512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"}),
    "avx2": frozenset({"avx2", "fma", "f16c"}),
    "portable": frozenset(),
}


@cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (x86: /proc/cpuinfo's `flags`, ARM: its `Features`)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_model(default: str = "unknown") -> str:
    """This CPU's model name (/proc/cpuinfo's `model name`), for every figure a result file records."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def runnable_isas(flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """The paths this CPU can execute, best first (`portable` always)."""
    flags = cpu_flags() if flags is None else flags
    if not is_x86():
        return ("portable",)
    return tuple(isa for isa in ISAS if REQUIRED_FLAGS[isa] <= flags)


def missing_flags(isa: str, flags: frozenset[str] | None = None) -> list[str]:
    flags = cpu_flags() if flags is None else flags
    if isa != "portable" and not is_x86():
        return [f"an x86 CPU (this is {platform.machine()})"]
    return sorted(REQUIRED_FLAGS[isa] - flags)


def check_isa(isa: str) -> str:
    """`isa` if it names a path this CPU can run; ValueError saying which flag is missing otherwise."""
    if isa not in ISAS:
        raise ValueError(f"{ISA_ENV} must be one of {', '.join(ISAS)}; got {isa!r}")
    missing = missing_flags(isa)
    if missing:
        raise ValueError(f"{ISA_ENV}={isa}: this CPU cannot run that path, it lacks {', '.join(missing)}")
    return isa


def forced_isa() -> str | None:
    """The path PAGEDSERVE_CPU_ISA forces (checked), or None when it is not set."""
    value = os.environ.get(ISA_ENV, "").strip().lower()
    return check_isa(value) if value else None


def preferred_isas() -> tuple[str, ...]:
    """The paths to try, in order: the forced one alone, else every runnable one, best first."""
    forced = forced_isa()
    return (forced,) if forced else runnable_isas()


def compile_flags(isa: str, flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """g++ flags of one path. CPU_CAPABILITY_* selects ATen's Vectorized implementation (vec512,
    vec256 or the scalar/NEON one) and CPU_CAPABILITY names its inline namespace."""
    flags = cpu_flags() if flags is None else flags
    if isa == "avx512":
        extra = ["-mavx512bf16"] if "avx512_bf16" in flags else []
        return (
            "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c", *extra,
            # 512-bit vectors for the compiler's own loops too (g++ prefers 256 on some Xeons).
            "-mprefer-vector-width=512", "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512",
        )  # fmt: skip
    if isa == "avx2":
        return ("-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2")
    if isa == "portable":
        return ("-DCPU_CAPABILITY=DEFAULT",)
    raise ValueError(f"unknown ISA path {isa!r}; one of {', '.join(ISAS)}")
