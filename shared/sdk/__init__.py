"""The pagedserve client SDK: talk to a scheduler over ZeroMQ. No torch, nothing from services/.

from pagedserve import Client
with Client("tcp://127.0.0.1:5555") as client:
    print(client.generate("Hello", max_tokens=16).text)
"""

from shared.sdk.async_client import AsyncClient
from shared.sdk.client import Client
from shared.sdk.keys import load_client_keys
from shared.sdk.results import Completion, RequestError, Result, StreamDelta, Usage
from shared.sdk.streams import AsyncStream, Stream

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
