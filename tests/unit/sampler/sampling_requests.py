"""Fixtures of the sampler tests: requests built through SamplingParams, so every field is validated."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from services.worker.sampler import SamplingRequest
from shared.protocol.frontend import SamplingParams

MakeRequest = Callable[..., SamplingRequest]


def sampling_request(
    prompt: Sequence[int] = (0,), output: Sequence[int] = (), **params: Any
) -> SamplingRequest:
    return SamplingRequest(SamplingParams(**params).model_dump(), list(prompt), list(output))


@pytest.fixture
def make_request() -> MakeRequest:
    """`make_request(prompt=..., output=..., temperature=..., ...)` -> a SamplingRequest."""
    return sampling_request
