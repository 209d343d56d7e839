"""`pagedserve generate`: one prompt through the SDK to a running deployment, printed as it comes."""

from __future__ import annotations

from typing import Any, TextIO


def generate_text(
    endpoint: str, prompt: str, out: TextIO, stream: bool = True, keys_dir: str | None = None, **sampling: Any
) -> str:
    """Send `prompt`, write the completion to `out` (token by token when streaming), return it.

    `keys_dir`: a `pagedserve keys` folder when the deployment speaks CURVE."""
    from pagedserve import Client  # lazily: `pagedserve health` and friends need no SDK
    from pagedserve.shared.sdk.keys import load_client_keys

    keys = load_client_keys(keys_dir) if keys_dir else {}
    with Client(endpoint, **keys) as client:
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
