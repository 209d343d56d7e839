"""`pagedserve generate`: one prompt through the SDK to a running deployment, printed as it comes."""

from __future__ import annotations

from typing import Any, TextIO


def generate_text(endpoint: str, prompt: str, out: TextIO, stream: bool = True, **sampling: Any) -> str:
    """Send `prompt`, write the completion to `out` (token by token when streaming), return it."""
    from pagedserve import Client  # lazily: `pagedserve health` and friends need no SDK

    client = Client(endpoint)
    try:
        if not stream:
            text = client.generate(prompt, **sampling).text
            out.write(text)
        else:
            parts = []
            for delta in client.stream(prompt, **sampling):
                out.write(delta.text)
                out.flush()
                parts.append(delta.text)
            text = "".join(parts)
        out.write("\n")
        out.flush()
        return text
    finally:
        # The SDK owns a ZeroMQ socket; close it so the process exits without lingering.
        close = getattr(client, "close", None)
        if close is not None:
            close()
