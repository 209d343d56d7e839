"""Fixtures shared by every test suite. Keep this small: suite-specific fixtures live with the suite."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness.tiny_models import make_tiny_model

from pagedserve.kernels.cpu.isa import ISAS, missing_flags, runnable_isas

# Markers by where a test lives (a new file there gets its marker without a line of its own): a
# folder, a file or one test, as its node id reads below tests/. The markers are declared in
# pyproject.toml, and README "Tests" names the quick loop that leaves them out.
MARKERS_BY_PLACE: dict[str, tuple[str, ...]] = {
    "chaos": ("chaos",),  # faults injected into real deployments: minutes each
    "slow": ("slow",),  # the real SmolLM2
    "integration": ("integration",),  # real processes over real sockets
    "integration/test_ray_deployment.py": ("ray",),  # a Ray cluster on this machine
    "integration/test_ray_shards.py": ("ray",),
    "packaging/test_wheel.py": ("packaging",),  # builds and installs a wheel
    "packaging/test_types.py": ("packaging",),  # the type checker over the sources: about a minute
    "unit/kernels/test_triton_": ("triton",),  # the Triton kernels, under the interpreter on a CPU
    # Every C++ kernel compiled for every ISA path, and a build killed mid-compile: a minute or more.
    "unit/kernels/test_kernel_build.py::test_every_path_compiles_": ("slow",),
    "unit/kernels/test_kernel_build.py::test_a_build_killed_midway_": ("slow",),
    # The portable path cross-compiled for ARM64 (a compile check, never cached): ~1 min on 2 cores.
    "unit/kernels/test_kernel_build.py::test_the_portable_path_compiles_for_arm64": ("slow",),
    # llama.cpp's own converter run on a tiny model (where the peer is built): ~50 s.
    "unit/worker/test_gguf_llamacpp_converted.py": ("slow",),
    "unit/worker/test_lora_gguf.py::test_llama_cpps_own_converter_output_": ("slow",),
    # A fresh interpreter each (a CLI, a tool end to end, what an import pulls in, the heap's page
    # faults): 2-9 s apiece, ~45 s in all on 2 cores, which kept the quick loop above 150 s.
    "packaging/test_lazy_imports.py": ("slow",),
    "unit/worker/test_heap.py": ("slow",),
    "unit/worker/test_cpu_dtype.py::test_the_cli_refuses_bfloat16_before_starting_anything": ("slow",),
    "unit/worker/test_quantized_memory.py::test_the_weights_rss_tool_runs_end_to_end_": ("slow",),
    "unit/worker/test_quantized_memory.py::test_loading_imports_neither_dynamo_nor_sympy": ("slow",),
    "unit/ops/test_bench.py::test_emulated_avx2_run_": ("slow",),
    "unit/ops/test_bench.py::test_quick_run_on_a_tiny_model_": ("slow",),
    "unit/ops/test_rss_peaks.py": ("slow",),
}


def _within(node: str, place: str) -> bool:
    if place.endswith("_"):  # a name prefix: every file (or test) whose name starts so
        return node.startswith(place)
    return node == place or node.startswith((place + "/", place + "::", place + "["))


# The quick loop (`pytest -m quick`): every test that carries none of these.
NOT_QUICK = frozenset({"chaos", "slow", "integration", "ray", "packaging", "triton", "docker"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        node = item.nodeid.removeprefix("tests/")
        for place, markers in MARKERS_BY_PLACE.items():
            if _within(node, place):
                for marker in markers:
                    item.add_marker(marker)
        if not any(item.get_closest_marker(name) for name in NOT_QUICK):
            item.add_marker("quick")


@pytest.fixture(scope="module", params=ISAS)
def isa(request: pytest.FixtureRequest) -> str:
    """Each C++ kernel ISA path in turn. Skipped only where this CPU cannot execute the path (naming
    the flags it lacks); a runnable path that does not build fails, it is never skipped."""
    if request.param not in runnable_isas():
        pytest.skip(
            f"this CPU cannot run the {request.param} path: it lacks {', '.join(missing_flags(request.param))}"
        )
    return request.param


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`tiny_model("llama" | "qwen2" | "qwen3" | "mistral", **make_tiny_model options)` -> checkpoint folder.

    Built once per session for each distinct set of arguments.
    """
    built: dict[str, Path] = {}

    def build(arch: str = "llama", **options: Any) -> Path:
        key = f"{arch}:{sorted(options.items())!r}"
        if key not in built:
            built[key] = make_tiny_model(arch, tmp_path_factory.mktemp(f"tiny-{arch}"), **options)
        return built[key]

    return build
