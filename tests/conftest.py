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
