"""Requests for the sampler tests, built through SamplingParams so every field is validated."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedserve.services.worker.sampler import SamplingRequest
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import WorkerSampling


def make_request(prompt: Sequence[int] = (0,), output: Sequence[int] = (), **params: Any) -> SamplingRequest:
    """`make_request(prompt=..., output=..., temperature=..., ...)` -> a SamplingRequest."""
    fields = SamplingParams(**params)
    return SamplingRequest(WorkerSampling.of(fields, fields.seed), list(prompt), list(output))
