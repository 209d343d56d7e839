"""`pagedserve bench --emulate-isa avx2|portable`: both peers run as if on a CPU without AVX-512.

Every layer that picks code by the CPU's flags is told to stop at the emulated ISA, through the
environment, before torch (or vLLM) first dispatches anything:
- pagedserve's own kernels: PAGEDSERVE_CPU_ISA (kernels/cpu/isa.py); bfloat16 is then refused as
  on such a CPU (services/worker/cpu_dtype.py);
- ATen's vectorised CPU kernels: ATEN_CPU_CAPABILITY;
- oneDNN's JIT (linears, packed weights): ONEDNN_MAX_CPU_ISA;
- MKL's sgemm: MKL_ENABLE_INSTRUCTIONS.
The vLLM peer inherits the same environment and is told to load its AVX2 build (`_C_AVX2`, which it
picks when torch reports no AVX-512): ops/bench/vllm_peer.py.

This is emulation, not the other CPU: another vendor's caches, memory bandwidth and MKL's code
paths on it differ, so a figure measured on the real machine stays the real check.
"""

from __future__ import annotations

import os
import sys

from pagedserve.kernels.cpu.isa import ISA_ENV, check_isa

ENVIRONMENT: dict[str, dict[str, str]] = {
    "avx2": {
        ISA_ENV: "avx2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "portable": {
        ISA_ENV: "portable",
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    },
}
NOTE = (
    "ISA emulation: every library was told to stop at {isa}; another CPU's caches, memory bandwidth "
    "and MKL's code paths on it differ, so figures from a real {isa} machine remain the real check"
)


def emulate_isa(isa: str) -> dict[str, str]:
    """Set the environment that makes this process and its children run `isa` code -> what was set.
    ValueError for a path this CPU cannot run, or when torch was imported too early to follow it."""
    if isa not in ENVIRONMENT:
        raise ValueError(f"--emulate-isa must be one of {', '.join(ENVIRONMENT)}; got {isa!r}")
    check_isa(isa)
    if "torch" in sys.modules:
        raise ValueError("--emulate-isa must take effect before torch is imported in this process")
    os.environ.update(ENVIRONMENT[isa])
    return dict(ENVIRONMENT[isa])
