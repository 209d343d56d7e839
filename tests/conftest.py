"""Fixtures shared by every test suite. Keep this small: suite-specific fixtures live with the suite."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pagedserve.kernels.cpu.isa import ISAS, missing_flags, runnable_isas
from tiny_models import make_tiny_model


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
