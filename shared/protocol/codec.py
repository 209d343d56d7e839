"""msgpack framing with a protocol version. No pickle on the wire, ever."""

from __future__ import annotations

from typing import Any

import msgpack

PROTOCOL_VERSION = 1


class ProtocolError(ValueError):
    """A frame that is not a valid pagedserve message. `code` is the machine-readable reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def encode(message_type: str, body: dict[str, Any]) -> bytes:
    """One frame: the body's fields plus `v` and `type`."""
    frame = {"v": PROTOCOL_VERSION, "type": message_type}
    frame.update(body)
    # msgpack has no stubs: pyright reads packb off the pure-Python Packer, whose pack() may return None
    # (autoreset=False only); packb always returns bytes.
    return msgpack.packb(frame, use_bin_type=True)  # pyright: ignore[reportReturnType]


def decode(frame: bytes, max_bytes: int | None = None) -> dict[str, Any]:
    """Bytes to a message map; raises ProtocolError for anything that is not a v1 frame."""
    if max_bytes is not None and len(frame) > max_bytes:
        raise ProtocolError(
            "too_large", f"frame of {len(frame)} bytes exceeds the limit of {max_bytes} bytes"
        )
    try:
        # strict_map_key=False keeps int keys legal; raw=False decodes str as str.
        message = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise ProtocolError("bad_frame", f"frame is not valid msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("bad_frame", f"frame must be a msgpack map, got {type(message).__name__}")
    version = message.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError("bad_version", f"field 'v' must be {PROTOCOL_VERSION}, got {version!r}")
    if not isinstance(message.get("type"), str):
        raise ProtocolError("bad_frame", "field 'type' must be a string naming the message type")
    return message
