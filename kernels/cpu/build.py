"""Builds one C++ kernel extension for one ISA path (torch.utils.cpp_extension) and loads its ops.

Six extensions, built and loaded apart so that one failing to build leaves the others usable:
paged_attention.cpp (paged attention and the K/V write), layer_ops.cpp (the decoder layer's fused
norms, residual adds, SiLU-and-mul, rotary), sampling.cpp (one step's draws), the quantized linear
(quant_linear.cpp, the ops, over quant_float.cpp and quant_int8.cpp, its float32- and int8-activation
drivers, and the block formats in quant_formats.h / quant_codes_x86.h), int8 KV (kv_int8*.cpp) and
LoRA deltas (lora.cpp). Each builds once per
ISA path (kernels/cpu/isa.py) into its own torch.ops namespace, `pagedserve_<name>_<isa>`, so the
three paths of one op can be loaded side by side (the tests compare each against torch).

A build lives under the pagedserve cache (PAGEDSERVE_CACHE, default ~/.cache/pagedserve), in a folder
named by a hash of its sources and headers (its own and the shared library.h), the flags, torch's
version, the compiler and the machine architecture. No `-march=native`: each path names its ISA flags, so its build is valid on every CPU
that runs that path (a Docker image's prebuilt kernels included), and `isa.py` decides which path a
CPU may load. Its outcome is remembered there, a failure as much as a success: the compiler runs once per
machine, not once per process. Builds hold an flock on the folder's lock file, which the kernel
drops when its holder dies, so a build killed midway never wedges the next one (torch's own `lock`
file, which a killed build leaves behind, is removed under it). First build ~30-60 s on 2 cores;
after that loading takes milliseconds.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from pagedserve.kernels.cpu.isa import compile_flags

HERE = Path(__file__).parent
SHARED_HEADERS = (HERE / "library.h",)  # every extension includes it
# -fopenmp: the op's own parallel region runs on torch's libgomp (same soname, already loaded).
BASE_CFLAGS = ("-O3", "-fopenmp", "-std=c++17")
LDFLAGS = ["-fopenmp"]
OK_MARKER, FAILED_MARKER, BUILD_LOG = "built", "failed", "build.log"


@dataclass(frozen=True, slots=True)
class Extension:
    name: str
    sources: tuple[Path, ...]
    cflags: tuple[str, ...] = ()  # this extension's own, on top of the base and the ISA's
    headers: tuple[Path, ...] = ()  # its own headers (hashed into its build folder with the sources)


ATTENTION_MATH = HERE / "attention_math.h"  # the vector math both attention kernels share
FAST_ITEM = HERE / "fast_item.h"  # their three-pass vector work item, less the K/V reads
PAGED_STEP = HERE / "paged_step.h"  # a step's work items and the ops' two entry points
PAGED_ATTENTION = Extension(
    "paged_attention", (HERE / "paged_attention.cpp",), headers=(ATTENTION_MATH, FAST_ITEM, PAGED_STEP)
)
LANE_SUM = HERE / "lane_sum.h"  # a vector's lanes summed in order
# -ffp-contract=off: no fused multiply-adds, so each product and sum rounds where torch's ops round.
LAYER_OPS = Extension("layer_ops", (HERE / "layer_ops.cpp",), ("-ffp-contract=off",), (LANE_SUM,))
SAMPLING = Extension("sampling", (HERE / "sampling.cpp",))
QUANT_LINEAR = Extension(
    "quant_linear",
    (
        HERE / "quant_linear.cpp",
        HERE / "quant_float.cpp",
        HERE / "quant_int8.cpp",
        HERE / "quant_interleaved.cpp",
        HERE / "int8_interleaved.cpp",
        HERE / "moe_experts.cpp",
    ),
    headers=(
        HERE / "quant_linear.h",
        HERE / "quant_formats.h",
        HERE / "quant_codes_x86.h",
        HERE / "int8_rows.h",
        HERE / "claimed_pieces.h",
        LANE_SUM,
    ),
)
# int8 KV: its write and its attention (the op and the scalar item; the vector item per ISA path)
KV_INT8 = Extension(
    "kv_int8",
    (HERE / "kv_int8.cpp", HERE / "kv_int8_attention.cpp"),
    headers=(ATTENTION_MATH, FAST_ITEM, PAGED_STEP, HERE / "kv_int8.h"),
)
# LoRA adapters' deltas of a step's rows, grouped by slot (BGMV-style)
LORA = Extension("lora", (HERE / "lora.cpp",), headers=(LANE_SUM,))
# A whole decoder layer in one call: the kernels above, reached through the dispatcher
DECODER_LAYER = Extension("decoder_layer", (HERE / "decoder_layer.cpp",))
EXTENSIONS = (PAGED_ATTENTION, LAYER_OPS, SAMPLING, QUANT_LINEAR, KV_INT8, LORA, DECODER_LAYER)

_lock = threading.Lock()
_loaded: set[str] = set()


class KernelBuildError(RuntimeError):
    """The C++ kernel could not be compiled or loaded here (no compiler, no headers...)."""


def library_name(extension: Extension, isa: str) -> str:
    """The torch.ops namespace the extension's ops register under on this path."""
    return f"pagedserve_{extension.name}_{isa}"


def build_flags(extension: Extension, isa: str) -> tuple[str, ...]:
    return (
        *BASE_CFLAGS,
        *compile_flags(isa),
        *extension.cflags,
        f"-DPAGEDSERVE_LIBRARY={library_name(extension, isa)}",
    )


def _compiler() -> str:
    return shutil.which(os.environ.get("CXX", "c++")) or "no-compiler"


def build_dir(extension: Extension, isa: str) -> Path:
    key = hashlib.sha256(
        b"\0".join(
            [
                *(f.read_bytes() for f in (*extension.sources, *extension.headers, *SHARED_HEADERS)),
                " ".join(build_flags(extension, isa)).encode(),
                torch.__version__.encode(),
                _compiler().encode(),
                platform.machine().encode(),
            ]
        )
    ).hexdigest()[:16]
    root = Path(os.environ.get("PAGEDSERVE_CACHE") or "~/.cache/pagedserve").expanduser()
    return root / "kernels" / f"{extension.name}_{isa}_{key}"


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


@contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """An exclusive flock on the build folder's lock file: released by the kernel when the holder
    exits, however it exits (a SIGKILL included), unlike torch's own lock file."""
    with open(directory.with_name(directory.name + ".lock"), "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _reason(log: str) -> str:
    """The first compiler error of a build log, on one line (else its last line)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    skip = ("Error building extension", "ninja: build stopped", "FAILED:")
    for marker in (" error: ", "error:", "Error", "error"):
        for line in lines:
            if marker in line and not line.startswith(skip):
                return line[:300]
    return (lines[-1] if lines else "no output")[:300]


def _compile(extension: Extension, isa: str, directory: Path) -> None:
    from torch.utils.cpp_extension import load

    _put_ninja_on_path()
    (directory / "lock").unlink(missing_ok=True)  # torch's baton, left by a build killed midway
    load(
        name=directory.name,
        sources=[str(source) for source in extension.sources],
        extra_cflags=list(build_flags(extension, isa)),
        extra_ldflags=LDFLAGS,
        build_directory=str(directory),
        is_python_module=False,
        verbose=False,
    )


def load_extension(extension: Extension, isa: str):
    """Build `extension` for `isa` once per machine and load it -> its torch.ops namespace.
    KernelBuildError (one line: which op, which path, why, where the full log is) where it cannot
    be built, now or in an earlier process on this machine."""
    library = library_name(extension, isa)
    if library in _loaded:
        return getattr(torch.ops, library)
    with _lock:
        if library not in _loaded:
            directory = build_dir(extension, isa)
            directory.mkdir(parents=True, exist_ok=True)
            with _build_lock(directory):
                _load_or_build(extension, isa, directory)
            _loaded.add(library)
    return getattr(torch.ops, library)


def _load_or_build(extension: Extension, isa: str, directory: Path) -> None:
    failed, log = directory / FAILED_MARKER, directory / BUILD_LOG
    if failed.exists():
        raise KernelBuildError(failed.read_text().strip())
    if (directory / OK_MARKER).exists():
        torch.ops.load_library(str(directory / f"{directory.name}.so"))
        return
    try:
        _compile(extension, isa, directory)
    except Exception as e:  # compiler missing or failing: remembered, so no other process retries it
        log.write_text(f"{type(e).__name__}: {e}\n")
        message = (
            f"{extension.name} [{isa}] did not build: {_reason(str(e))} "
            f"(full log {log}; remove {directory} to retry)"
        )
        failed.write_text(message + "\n")
        raise KernelBuildError(message) from e
    (directory / OK_MARKER).write_text("ok\n")


def compile_check(extension: Extension, isa: str, cxx: str | None = None, syntax_only: bool = False) -> None:
    """Compile `extension` for `isa` without linking or loading it: how a path this CPU cannot execute
    (AVX-512 code on an AVX2 machine) is still proven to build. `cxx` names another compiler (a cross
    compiler: the portable path for ARM64); `syntax_only` stops after parsing and template
    instantiation, which is where a foreign architecture's missing intrinsics show. KernelBuildError
    with the first error."""
    import subprocess
    import tempfile

    from torch.utils.cpp_extension import include_paths

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-isystem{path}" for path in include_paths()]
    compiler = cxx or os.environ.get("CXX", "c++")
    for source in extension.sources:
        with tempfile.TemporaryDirectory() as scratch:
            output = (
                ["-fsyntax-only"] if syntax_only else ["-c", "-fPIC", "-o", str(Path(scratch) / "check.o")]
            )
            argv = [
                compiler, *output,
                *includes, f"-I{HERE}", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_API_INCLUDE_EXTENSION_H",
                f"-DTORCH_EXTENSION_NAME={library_name(extension, isa)}", *build_flags(extension, isa), str(source),
            ]  # fmt: skip
            done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise KernelBuildError(
                f"{extension.name} [{isa}] does not compile with {compiler}: {_reason(done.stderr)}"
            )
