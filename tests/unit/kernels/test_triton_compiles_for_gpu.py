"""The kernels compile for a real GPU (sm_90, down to a cubin) on this CPU-only machine.

The interpreter accepts tiles the compiler rejects, so interpreter tests alone cannot say this.
Runs in a subprocess: this session's kernels were defined for the interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton_env  # noqa: F401  (before any kernels import: selects the Triton interpreter)

REPO = Path(__file__).resolve().parents[3]


def _has_nvidia_backend() -> bool:
    from triton.backends import backends

    return "nvidia" in backends


@pytest.mark.skipif(not _has_nvidia_backend(), reason="this triton build has no NVIDIA backend")
def test_every_launch_variant_compiles_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9 warns when unset
    # bf16 exercises the tensor-core path; fp32's ieee path is compiled by `--dtype fp32` (slow: minutes).
    proc = subprocess.run(
        [sys.executable, "-m", "pagedserve.kernels.triton.compile_check", "--dtype", "bf16", "--arch", "90"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "0 failed" in proc.stdout
