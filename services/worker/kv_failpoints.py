"""Failpoints inside a step: after each layer's K/V write (a crash mid-step, mid-K/V-write, mid-prefill).

Armed only in test deployments. The backend's `write_kv` is wrapped on this one backend object, which
every attention layer calls, and only when one of these points is armed: a production worker runs
the bare kernel.
"""

from __future__ import annotations

from typing import Any

import torch

from pagedserve.kernels.attention import AttentionBackend
from pagedserve.shared import failpoints

POINTS = ("worker.kv_write", "worker.prefill_kv_write")


def watch_kv_writes(backend: AttentionBackend, prefilling: Any) -> bool:
    """Fire the K/V-write failpoints after every layer's write; `prefilling()` says whether the step
    computes part of a prompt. True if a point is armed (and the backend now wrapped)."""
    if not set(POINTS) & set(failpoints.armed()):
        return False
    write = backend.write_kv

    def write_then_fire(
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        write(key, value, k_cache, v_cache, slots)
        failpoints.fire("worker.kv_write")
        if prefilling():
            failpoints.fire("worker.prefill_kv_write")

    vars(backend)["write_kv"] = write_then_fire  # an instance attribute: this one object, its class untouched
    return True
