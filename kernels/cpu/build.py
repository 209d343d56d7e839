"""Builds kernels/cpu/paged_attention.cpp at first use (torch.utils.cpp_extension) and loads its op.

The build lives under the pagedserve cache (PAGEDSERVE_CACHE, default ~/.cache/pagedserve), in a
folder named by a hash of the source, the flags, torch's version and this CPU's instruction-set
flags: -march=native code must never be loaded on a CPU it was not built for, and a changed source
rebuilds. First build ~30-60 s on 2 cores; after that loading takes milliseconds.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("paged_attention.cpp")
# -march=native: AVX-512 where the CPU has it; 512-bit vectors (g++ prefers 256 on some Xeons).
# -fopenmp: the op's own parallel region runs on torch's libgomp (same soname, already loaded).
CFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-std=c++17"]
LDFLAGS = ["-fopenmp"]

_lock = threading.Lock()
_loaded = False


class KernelBuildError(RuntimeError):
    """The C++ kernel could not be compiled or loaded here (no compiler, no headers...)."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


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
    return root / "kernels" / f"paged_attention_{key}"


def _put_ninja_on_path() -> None:
    """cpp_extension runs `ninja` from PATH; a worker started as `.venv/bin/python -m ...` may not have
    the venv's bin folder there, so fall back to the `ninja` package's binary."""
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def load_paged_attention() -> None:
    """Make torch.ops.pagedserve.paged_attention available (build once per source/CPU/torch)."""
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
        except Exception as e:  # compiler missing or failing: the caller decides whether to fall back
            raise KernelBuildError(f"building {SOURCE.name} in {directory} failed: {e}") from e
        _loaded = True
