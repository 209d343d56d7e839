"""Builds kernels/cpu/sampling.cpp at first use (torch.utils.cpp_extension) and loads its op,
torch.ops.pagedserve_sampling.sample_rows.

The same scheme as the paged attention kernel (kernels/cpu/build.py): the build lives under the
pagedserve cache in a folder named by a hash of the source, the flags, torch's version and this
CPU's instruction-set flags, so -march=native code is never loaded on another CPU and a changed
source rebuilds. First build ~15-30 s on 2 cores; after that loading takes milliseconds.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import torch
from pagedserve.kernels.cpu.build import KernelBuildError, _cpu_flags, _put_ninja_on_path

SOURCE = Path(__file__).with_name("sampling.cpp")
# -fopenmp: at::parallel_for's OpenMP region is compiled into this library (ATen's inline header).
CFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-std=c++17"]
LDFLAGS = ["-fopenmp"]

_lock = threading.Lock()
_loaded = False


def build_dir() -> Path:
    key = hashlib.sha256(
        b"\0".join(
            [
                SOURCE.read_bytes(),
                " ".join(CFLAGS).encode(),
                torch.__version__.encode(),
                _cpu_flags().encode(),
            ]
        )
    ).hexdigest()[:16]
    root = Path(os.environ.get("PAGEDSERVE_CACHE") or "~/.cache/pagedserve").expanduser()
    return root / "kernels" / f"sampling_{key}"


def load_sampling() -> None:
    """Make torch.ops.pagedserve_sampling.sample_rows available (build once per source/CPU/torch).
    Raises KernelBuildError if this machine cannot build it."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        from torch.utils.cpp_extension import load

        _put_ninja_on_path()
        directory = build_dir()
        directory.mkdir(parents=True, exist_ok=True)
        try:
            load(
                name=directory.name,
                sources=[str(SOURCE)],
                extra_cflags=CFLAGS,
                extra_ldflags=LDFLAGS,
                build_directory=str(directory),
                is_python_module=False,
                verbose=False,
            )
        except Exception as e:  # compiler missing or failing: the sampler falls back to torch
            raise KernelBuildError(f"building {SOURCE.name} in {directory} failed: {e}") from e
        _loaded = True
