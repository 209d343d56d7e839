"""The pagedserve client SDK: talk to a scheduler over ZeroMQ. No torch, nothing from services/.

from pagedserve import Client
with Client("tcp://127.0.0.1:5555") as client:
    print(client.generate("Hello", max_tokens=16).text)
"""

from pagedserve.shared.sdk.async_client import AsyncClient
from pagedserve.shared.sdk.client import Client
from pagedserve.shared.sdk.keys import load_client_keys
from pagedserve.shared.sdk.results import Completion, RequestError, Result, StreamDelta, Usage
from pagedserve.shared.sdk.streams import AsyncStream, Stream

__all__ = [
    "AsyncClient",
    "AsyncStream",
    "Client",
    "Completion",
    "RequestError",
    "Result",
    "Stream",
    "StreamDelta",
    "Usage",
    "load_client_keys",
]
