"""The one loader of the C++ kernels: the best ISA path this CPU runs (or the forced one), else None.

Every user of a C++ op (the attention backend, the layer ops, the sampler) asks here. A path that
does not build is logged once per process, on one line (op, path, reason, log file), and the next
path down is tried; when none builds the caller runs its torch form. `kernel_paths()` says what
each op ended on, for the worker's start log and its announcements (the scheduler's `/workers`).
"""

from __future__ import annotations

import structlog

from pagedserve.kernels.cpu.build import EXTENSIONS, Extension, KernelBuildError, load_extension
from pagedserve.kernels.cpu.isa import preferred_isas

TORCH_FALLBACK = "torch"

_paths: dict[str, str] = {}  # op -> the ISA path it runs, or TORCH_FALLBACK
_warned: set[tuple[str, str]] = set()  # (op, isa) build failures already logged in this process


def load_ops(extension: Extension):
    """The extension's torch.ops namespace on the best path that builds; KernelBuildError naming
    every path's failure when none does."""
    errors = []
    for isa in preferred_isas():
        try:
            ops = load_extension(extension, isa)
        except KernelBuildError as e:
            if (extension.name, isa) not in _warned:
                _warned.add((extension.name, isa))
                structlog.get_logger("pagedserve.kernels").warning(
                    "cpp_kernel_unavailable", op=extension.name, isa=isa, reason=str(e)
                )
            errors.append(str(e))
            continue
        _paths[extension.name] = isa
        return ops
    _paths[extension.name] = TORCH_FALLBACK
    raise KernelBuildError("; ".join(errors) or f"{extension.name}: no ISA path to try")


def try_load_ops(extension: Extension):
    """load_ops, or None where no path builds (the caller runs torch ops; the reason is logged)."""
    try:
        return load_ops(extension)
    except KernelBuildError:
        return None


def kernel_paths() -> dict[str, str]:
    """Each C++ op loaded in this process -> the ISA path it runs (`torch` where it fell back)."""
    return {e.name: _paths[e.name] for e in EXTENSIONS if e.name in _paths}


def note_torch_path(extension: Extension) -> None:
    """Record that a caller chose the torch form of this op (a setting, not a failure)."""
    _paths[extension.name] = TORCH_FALLBACK


def main(argv: list[str] | None = None) -> None:
    """Build every op for the path this CPU runs (setup calls this once) and say which path each uses;
    `--all-paths` also builds every other path this CPU can run (the Docker image does)."""
    import sys

    from pagedserve.kernels.cpu.isa import runnable_isas

    args = sys.argv[1:] if argv is None else argv
    for extension in EXTENSIONS:
        try_load_ops(extension)
        for isa in runnable_isas()[1:] if "--all-paths" in args else ():
            try:
                load_extension(extension, isa)
            except KernelBuildError as e:
                print(f"setup: {e}")
    paths = kernel_paths()
    print("setup: C++ kernels: " + ", ".join(f"{name} {path}" for name, path in paths.items()))


if __name__ == "__main__":
    main()
