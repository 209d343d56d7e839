"""pagedserve's public face: `from pagedserve import Client, AsyncClient, LLM, SamplingParams`.

Imports are lazy so the client SDK (Client, AsyncClient, SamplingParams) never pulls in torch.
"""

from __future__ import annotations

from typing import Any

from shared.protocol.frontend import SamplingParams

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
    "LLM": ("services.engine", "LLM"),
    "RequestOutput": ("services.engine", "RequestOutput"),
    "Client": ("shared.sdk", "Client"),
    "AsyncClient": ("shared.sdk", "AsyncClient"),
    "RequestError": ("shared.sdk", "RequestError"),
    "Result": ("shared.sdk", "Result"),
    "StreamDelta": ("shared.sdk", "StreamDelta"),
    "load_client_keys": ("shared.sdk", "load_client_keys"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'pagedserve' has no attribute {name!r}")
