"""Every sampler test that draws runs on both backends: the C++ op must keep the torch path's semantics."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["torch", "cpp"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param
