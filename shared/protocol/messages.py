"""Every message type that crosses a socket, by its `type` tag: the protocol read as one table.

Public messages (`frontend`) are pydantic models, validated on arrival. Internal ones have `TYPE`,
`to_wire()` (the frame's body) and `from_wire(body)`: control messages check their fields there, the
step messages (`execute`, `step_result`) hand their msgspec body to msgspec, which checks its types,
and the block frames only read theirs.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from pagedserve.shared.protocol.blocks import BlockBatch, BlockReply
from pagedserve.shared.protocol.codec import ProtocolError, encode
from pagedserve.shared.protocol.control import CONTROL_MESSAGES
from pagedserve.shared.protocol.frontend import CLIENT_MESSAGES, SERVER_MESSAGES
from pagedserve.shared.protocol.step import ExecuteMessage, StepResultMessage

INTERNAL_MESSAGES: dict[str, Any] = {
    m.TYPE: m for m in (*CONTROL_MESSAGES, ExecuteMessage, StepResultMessage, BlockBatch, BlockReply)
}
PUBLIC_MESSAGES: dict[str, type[BaseModel]] = {**CLIENT_MESSAGES, **SERVER_MESSAGES}
MESSAGES: dict[str, Any] = {**INTERNAL_MESSAGES, **PUBLIC_MESSAGES}


def message_table(*types: Any) -> dict[str, Any]:
    """The types one receiver takes, by tag (for `read_message`)."""
    return {t.model_fields["type"].default if issubclass(t, BaseModel) else t.TYPE: t for t in types}


def encode_message(message: Any) -> bytes:
    """The frame of any declared message."""
    if isinstance(message, BaseModel):
        body = message.model_dump()  # every public message's fields hold its `type` tag
        return encode(body["type"], body)
    return encode(message.TYPE, message.to_wire())


def read_message(frame: dict[str, Any], expected: dict[str, Any] | None = None) -> Any:
    """The declared message of a decoded frame; raises ProtocolError for an unknown type or bad fields.

    `expected` narrows the types this receiver takes (default: every internal one). Client messages
    are read by the scheduler's front door, which answers a bad one with an Error naming the field."""
    table = INTERNAL_MESSAGES if expected is None else expected
    kind = frame.get("type")
    message_type = table.get(kind) if isinstance(kind, str) else None
    if message_type is None:
        raise ProtocolError("unknown_type", f"unknown message type {kind!r}; expected one of {sorted(table)}")
    if issubclass(message_type, BaseModel):
        return message_type.model_validate({k: v for k, v in frame.items() if k != "v"})
    try:
        return message_type.from_wire(frame)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ProtocolError):
            raise
        raise ProtocolError("bad_fields", f"{kind}: {exc!r}") from None
