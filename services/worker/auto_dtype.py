"""What `--dtype auto` becomes on a CPU: the faster of bfloat16 and float32, with the reason logged.

The rule, by what was measured (docs/cpu-performance.md, "bfloat16 without AMX"):
- the ISA setting hides AVX-512 (`PAGEDSERVE_CPU_ISA=avx2|portable`, `--emulate-isa`), or the CPU has
  neither AMX nor AVX512-BF16: float32. bfloat16 there is refused or runs through conversions
  (1.3 GFLOP/s against 128.5 on an AMD EPYC Zen 3).
- AMX-bf16 (Intel Sapphire Rapids and later): bfloat16. Its GEMMs ran 2-3x float32 from 8 rows up,
  and the bench workload 1.19-1.28x vLLM's bf16.
- AVX512-BF16 without AMX (AMD Zen 4 / Zen 5, Intel Cooper Lake): measured, not assumed. oneDNN's
  bf16 GEMM there is `vdpbf16ps` on AVX-512 units that differ by family (Zen 4 double-pumps 512-bit
  ops, Zen 5 does not), and one report had bf16 at 0.63x float32 on a Zen 5. So a short probe
  times oneDNN's packed GEMM in both dtypes at decode-sized row counts and picks bfloat16 only where
  it is clearly faster (BF16_MARGIN). The probe counts the thread's CPU time on one thread, so other
  processes on shared cores do not move it much; its result is cached per machine (CPU model, flags
  and torch version) under the pagedserve cache, like the kernel builds, so it runs once.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from pagedserve.kernels.cpu.isa import ISA_ENV, cpu_flags, cpu_model, forced_isa

BF16_MARGIN = 0.85  # bfloat16 is picked when its GEMMs take at most this share of float32's time
PROBE_ROWS = (1, 16, 64)  # decode batches: one request, a few, the bench's 64
PROBE_SHAPES = ((1536, 576), (576, 1536), (960, 576))  # [out, in]: a small model's MLP and q/k/v
PROBE_COPIES = 4  # weights per shape: 13 MB of float32 in all, past the L2, as a model's are


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    dtype: str
    reason: str


@dataclass(frozen=True, slots=True)
class GemmProbe:
    """CPU seconds of the probe's GEMMs, one thread, per dtype."""

    float32_s: float
    bfloat16_s: float

    @property
    def ratio(self) -> float:
        return self.bfloat16_s / self.float32_s


def choose_cpu_dtype(
    flags: frozenset[str], forced: str | None, probe: Callable[[], tuple[GemmProbe, str]]
) -> DtypeChoice:
    """The rule above, on this CPU's flags and forced ISA path; `probe` -> (its timings, where they
    came from) is called only where the flags leave the answer to measurement."""
    if forced in ("avx2", "portable"):
        return DtypeChoice("float32", f"{ISA_ENV}={forced} hides AVX-512, which bfloat16 needs")
    if "amx_bf16" in flags:
        return DtypeChoice("bfloat16", "AMX-bf16: bfloat16 GEMMs measured 2-3x float32's speed")
    if "avx512_bf16" not in flags:
        return DtypeChoice("float32", "neither AMX-bf16 nor AVX512-BF16: bfloat16 would be emulated")
    timings, source = probe()
    verdict = "bfloat16" if timings.ratio <= BF16_MARGIN else "float32"
    return DtypeChoice(
        verdict,
        f"AVX512-BF16 without AMX: bfloat16 GEMMs took {timings.ratio:.2f}x float32's time "
        f"({source}; bfloat16 needs <= {BF16_MARGIN})",
    )


def auto_cpu_dtype() -> DtypeChoice:
    """The choice for this CPU (the probe, where needed, cached per machine)."""
    if not torch.backends.mkldnn.is_available():
        return DtypeChoice("float32", "this torch has no oneDNN, torch's only fast bfloat16 CPU path")
    return choose_cpu_dtype(cpu_flags(), forced_isa(), cached_probe)


def probe_cache_file() -> Path:
    root = Path(os.environ.get("PAGEDSERVE_CACHE") or "~/.cache/pagedserve").expanduser()
    key = "|".join([cpu_model(), " ".join(sorted(cpu_flags())), torch.__version__])
    return root / "dtype-probe" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def cached_probe() -> tuple[GemmProbe, str]:
    """The probe's timings from this machine's cache, else measured now and cached."""
    path = probe_cache_file()
    try:
        saved = json.loads(path.read_text())
        return GemmProbe(float(saved["float32_s"]), float(saved["bfloat16_s"])), f"probe cached in {path}"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    timings = probe_gemms()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"float32_s": timings.float32_s, "bfloat16_s": timings.bfloat16_s}))
        tmp.replace(path)  # atomic: a concurrent worker reads the old file or the new, never half
    except OSError:
        return timings, "probed now (not cached: the cache folder is not writable)"
    return timings, f"probed now, cached in {path}"


def probe_gemms(repeats: int = 3) -> GemmProbe:
    """oneDNN's packed GEMM (what the linears run) on PROBE_SHAPES x PROBE_COPIES weights at each of
    PROBE_ROWS, per dtype: the best of `repeats` passes of the thread's CPU time, on one thread.
    Under a second on an AMD EPYC Zen 4 (2 shared cores), once per machine."""
    from pagedserve.services.worker.layers.packed_linear import pack_linear

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        best: dict[torch.dtype, float] = {}
        for dtype in (torch.float32, torch.bfloat16):
            weights = [
                torch.randn(shape, generator=generator).to(dtype)
                for shape in PROBE_SHAPES
                for _ in range(PROBE_COPIES)
            ]
            # F.linear where packing is not available for the dtype: what the model would run then.
            linears = [pack_linear(w) or partial(F.linear, weight=w) for w in weights]
            inputs = [
                torch.randn(rows, w.shape[1], generator=generator).to(dtype)
                for w in weights
                for rows in PROBE_ROWS
            ]

            _one_pass(linears, inputs)  # warm-up: oneDNN builds its kernels on each shape's first call
            best[dtype] = min(_one_pass(linears, inputs) for _ in range(repeats))
        return GemmProbe(best[torch.float32], best[torch.bfloat16])
    finally:
        torch.set_num_threads(threads)


def _one_pass(linears: Sequence[Callable[[torch.Tensor], torch.Tensor]], inputs: list[torch.Tensor]) -> float:
    """The thread's CPU seconds for every linear at every probe row count (inputs in that order)."""
    t0 = time.thread_time()
    calls = iter(inputs)
    for linear in linears:
        for _ in PROBE_ROWS:
            linear(next(calls))
    return time.thread_time() - t0
