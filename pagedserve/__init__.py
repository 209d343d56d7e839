"""pagedserve's public face: `from pagedserve import Client, AsyncClient, LLM, SamplingParams`.

Imports are lazy so the client SDK (Client, AsyncClient, SamplingParams) never pulls in torch, and
`pagedserve.kernels` needs nothing but torch and triton (the GPU check runs where pydantic is not).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LLM",
    "AsyncClient",
    "Client",
    "RequestError",
    "RequestOutput",
    "Result",
    "SamplingParams",
    "StreamDelta",
    "load_client_keys",
]

_LAZY = {
    "LLM": ("pagedserve.engine", "LLM"),
    "RequestOutput": ("pagedserve.engine", "RequestOutput"),
    "SamplingParams": ("pagedserve.shared.protocol.frontend", "SamplingParams"),
    "Client": ("pagedserve.shared.sdk", "Client"),
    "AsyncClient": ("pagedserve.shared.sdk", "AsyncClient"),
    "RequestError": ("pagedserve.shared.sdk", "RequestError"),
    "Result": ("pagedserve.shared.sdk", "Result"),
    "StreamDelta": ("pagedserve.shared.sdk", "StreamDelta"),
    "load_client_keys": ("pagedserve.shared.sdk", "load_client_keys"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'pagedserve' has no attribute {name!r}")
