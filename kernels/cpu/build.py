"""Builds the C++ CPU kernels at first use (torch.utils.cpp_extension) and loads their ops.

Three extensions, built and loaded apart so that one failing to build leaves the others usable:
paged_attention.cpp (torch.ops.pagedserve: paged attention and the K/V write), layer_ops.cpp
(torch.ops.pagedserve_ops: the decoder layer's fused norms, residual adds, SiLU-and-mul, rotary) and
sampling.cpp (torch.ops.pagedserve_sampling: one step's draws).

Each build lives under the pagedserve cache (PAGEDSERVE_CACHE, default ~/.cache/pagedserve), in a
folder named by a hash of every source, the flags, torch's version and this CPU's instruction-set
flags: -march=native code must never be loaded on a CPU it was not built for, and a changed source
rebuilds. First build ~30-60 s on 2 cores; after that loading takes milliseconds.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).parent
# -march=native: AVX-512 where the CPU has it; 512-bit vectors (g++ prefers 256 on some Xeons).
# -fopenmp: the op's own parallel region runs on torch's libgomp (same soname, already loaded).
CFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-std=c++17"]
LDFLAGS = ["-fopenmp"]


@dataclass(frozen=True, slots=True)
class Extension:
    name: str
    sources: tuple[Path, ...]
    cflags: tuple[str, ...]


PAGED_ATTENTION = Extension("paged_attention", (HERE / "paged_attention.cpp",), tuple(CFLAGS))
# -ffp-contract=off: no fused multiply-adds, so each product and sum rounds where torch's ops round.
LAYER_OPS = Extension("layer_ops", (HERE / "layer_ops.cpp",), (*CFLAGS, "-ffp-contract=off"))
SAMPLING = Extension("sampling", (HERE / "sampling.cpp",), tuple(CFLAGS))

_lock = threading.Lock()
_loaded: set[str] = set()


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


def build_dir(extension: Extension = PAGED_ATTENTION) -> Path:
    key = hashlib.sha256(
        b"\0".join(
            [
                *(source.read_bytes() for source in extension.sources),
                " ".join(extension.cflags).encode(),
                torch.__version__.encode(),
                _cpu_flags().encode(),
            ]
        )
    ).hexdigest()[:16]
    root = Path(os.environ.get("PAGEDSERVE_CACHE") or "~/.cache/pagedserve").expanduser()
    return root / "kernels" / f"{extension.name}_{key}"


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


def load_extension(extension: Extension) -> None:
    """Build `extension` once per source/CPU/torch and load it; KernelBuildError where it cannot be."""
    if extension.name in _loaded:
        return
    with _lock:
        if extension.name in _loaded:
            return
        from torch.utils.cpp_extension import load

        _put_ninja_on_path()
        directory = build_dir(extension)
        directory.mkdir(parents=True, exist_ok=True)
        try:
            load(
                name=directory.name,
                sources=[str(source) for source in extension.sources],
                extra_cflags=list(extension.cflags),
                extra_ldflags=LDFLAGS,
                build_directory=str(directory),
                is_python_module=False,
                verbose=False,
            )
        except Exception as e:  # compiler missing or failing: the caller decides whether to fall back
            names = ", ".join(source.name for source in extension.sources)
            raise KernelBuildError(f"building {names} in {directory} failed: {e}") from e
        _loaded.add(extension.name)


def load_paged_attention() -> None:
    """Make torch.ops.pagedserve.paged_attention available."""
    load_extension(PAGED_ATTENTION)


def load_layer_ops() -> None:
    """Make torch.ops.pagedserve_ops.{rms_norm, fused_add_rms_norm, silu_and_mul, rotary_} available."""
    load_extension(LAYER_OPS)


def load_sampling() -> None:
    """Make torch.ops.pagedserve_sampling.sample_rows available."""
    load_extension(SAMPLING)
