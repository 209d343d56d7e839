"""How the C++ kernels are built: one folder per extension, path and inputs; an outcome remembered,
failure included; a lock that dies with its holder."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pagedserve.kernels.cpu.build import (
    EXTENSIONS,
    LAYER_OPS,
    PAGED_ATTENTION,
    SHARED_HEADERS,
    Extension,
    KernelBuildError,
    build_dir,
    compile_check,
    load_extension,
)
from pagedserve.kernels.cpu.isa import ISAS, is_x86, runnable_isas

# A tiny op, so the build tests compile in seconds (torch's headers are most of it).
TINY_SOURCE = textwrap.dedent(
    """
    #include <torch/library.h>
    #include <torch/types.h>
    at::Tensor twice(const at::Tensor& x) { return x * 2; }
    #define DEF_(ns, m) TORCH_LIBRARY(ns, m)
    #define IMPL_(ns, m) TORCH_LIBRARY_IMPL(ns, CPU, m)
    DEF_(PAGEDSERVE_LIBRARY, m) { m.def("twice(Tensor x) -> Tensor"); }
    IMPL_(PAGEDSERVE_LIBRARY, m) { m.impl("twice", &twice); }
    """
)


def test_each_extension_and_path_builds_in_its_own_folder():
    assert build_dir(LAYER_OPS, "avx2") != build_dir(PAGED_ATTENTION, "avx2")
    assert build_dir(LAYER_OPS, "avx2") != build_dir(LAYER_OPS, "portable")
    assert build_dir(LAYER_OPS, "portable").name.startswith("layer_ops_portable_")


def test_every_header_moves_the_builds_that_include_it():
    """A header is hashed into a build's folder only where an extension names it (or it is shared):
    one left out would let a stale build survive a change to it."""
    named = set(SHARED_HEADERS) | {h for e in EXTENSIONS for h in e.headers}
    assert set(SHARED_HEADERS[0].parent.glob("*.h")) == named


def test_a_change_to_any_source_moves_the_build(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path / "cache"))
    first, second = tmp_path / "a.cpp", tmp_path / "b.cpp"
    first.write_text("int a;")
    second.write_text("int b;")
    extension = Extension("two", (first, second))
    before = build_dir(extension, "portable")
    assert before.parent == tmp_path / "cache" / "kernels"
    second.write_text("int b2;")
    assert build_dir(extension, "portable") != before
    second.write_text("int b;")
    assert build_dir(extension, "portable") == before


def test_other_flags_move_the_build(tmp_path):
    source = tmp_path / "a.cpp"
    source.write_text("int a;")
    assert build_dir(Extension("x", (source,), ("-O3",)), "portable") != build_dir(
        Extension("x", (source,), ("-O2",)), "portable"
    )


def test_a_failed_build_is_remembered_and_named_on_one_line(tmp_path, monkeypatch):
    """The compiler runs once per machine: a second load of a failed build raises the same one-line
    error without compiling again."""
    calls = tmp_path / "compiler-calls"
    compiler = tmp_path / "broken-c++"
    compiler.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\necho "broken: error: no compiler today" >&2\nexit 1\n'
    )
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "tiny.cpp"
    source.write_text(TINY_SOURCE)
    extension = Extension("tiny_broken", (source,))

    with pytest.raises(KernelBuildError) as first:
        load_extension(extension, "portable")
    compiled = calls.read_text()
    assert compiled  # the compiler was really asked
    message = str(first.value)
    assert "\n" not in message
    assert message.startswith("tiny_broken [portable] did not build:")
    assert "full log" in message and (build_dir(extension, "portable") / "build.log").is_file()

    with pytest.raises(KernelBuildError) as second:
        load_extension(extension, "portable")
    assert str(second.value) == message
    assert calls.read_text() == compiled  # not compiled again


def _loader(cache: Path, source: Path) -> list[str]:
    code = textwrap.dedent(
        f"""
        import torch
        from pathlib import Path
        from pagedserve.kernels.cpu.build import Extension, load_extension
        ops = load_extension(Extension("tiny_killed", (Path({str(source)!r}),)), "portable")
        assert ops.twice(torch.ones(2)).tolist() == [2.0, 2.0]
        print("loaded")
        """
    )
    return [sys.executable, "-c", code]


def test_a_build_killed_midway_does_not_wedge_the_next_process(tmp_path):
    cache = tmp_path / "cache"
    source = tmp_path / "tiny.cpp"
    source.write_text(TINY_SOURCE)
    env = {**os.environ, "PAGEDSERVE_CACHE": str(cache)}
    first = subprocess.Popen(_loader(cache, source), env=env, start_new_session=True)
    # torch's baton file appears when the compile starts; kill the builder and its compiler then.
    deadline = time.monotonic() + 120
    while not list(cache.glob("kernels/tiny_killed_*/lock")):
        assert first.poll() is None, "the first build ended before it could be killed"
        assert time.monotonic() < deadline, "the first build never started compiling"
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert list(cache.glob("kernels/tiny_killed_*/lock"))  # what wedged every later build before

    second = subprocess.run(_loader(cache, source), env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "loaded" in second.stdout


# Paths this CPU runs are built, loaded and held to torch by each op's own tests; the rest of the x86
# paths are compiled here (not loaded), so an AVX2 machine still proves the AVX-512 code builds.
UNRUNNABLE = [(e, isa) for e in EXTENSIONS for isa in ISAS if isa not in runnable_isas() and is_x86()]


@pytest.mark.parametrize(("extension", "isa"), UNRUNNABLE, ids=[f"{e.name}-{isa}" for e, isa in UNRUNNABLE])
def test_every_path_compiles_even_where_this_cpu_cannot_run_it(extension, isa):
    compile_check(extension, isa)


# ARM64 (Graviton, Ampere) runs the portable path; no ARM machine is at hand, so Debian's cross
# compiler checks that every op's portable source, with torch's headers (ATen's NEON Vectorized),
# parses and instantiates for aarch64: no x86 intrinsic, no x86-only header. ops/setup.sh installs it.
ARM64_CXX = shutil.which("aarch64-linux-gnu-g++")


@pytest.mark.skipif(ARM64_CXX is None, reason="no aarch64-linux-gnu-g++ (Debian's g++-aarch64-linux-gnu)")
@pytest.mark.parametrize("extension", EXTENSIONS, ids=[e.name for e in EXTENSIONS])
def test_the_portable_path_compiles_for_arm64(extension):
    compile_check(extension, "portable", cxx=ARM64_CXX, syntax_only=True)


def test_a_portable_source_with_x86_intrinsics_fails_the_arm64_check(tmp_path):
    if ARM64_CXX is None:
        pytest.skip("no aarch64-linux-gnu-g++ (Debian's g++-aarch64-linux-gnu)")
    source = tmp_path / "x86_only.cpp"
    source.write_text("#include <immintrin.h>\nint f() { return _mm_cvtsi128_si32(_mm_set1_epi32(1)); }\n")
    with pytest.raises(KernelBuildError, match=r"x86_only \[portable\] does not compile"):
        compile_check(Extension("x86_only", (source,)), "portable", cxx=ARM64_CXX, syntax_only=True)
