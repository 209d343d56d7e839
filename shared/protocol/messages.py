"""Every message type that crosses a socket, by its `type` tag: the protocol read as one table.

One file per channel declares its messages: frontend.py (client <-> scheduler, pydantic: users
write them as JSON), step.py (scheduler <-> worker), blocks.py (scheduler <-> block manager) and
control.py (who is there, who owns what). The internal ones are msgspec Structs with a `TYPE`; the
frame's `body` holds their msgpack, which msgspec writes and reads back checking every field
(structs.py). Nothing here knows a message's fields.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from pydantic import BaseModel

from pagedserve.shared.protocol.blocks import BlockBatch, BlockReply, read_batch
from pagedserve.shared.protocol.codec import ProtocolError, encode
from pagedserve.shared.protocol.control import CONTROL_MESSAGES
from pagedserve.shared.protocol.frontend import CLIENT_MESSAGES, SERVER_MESSAGES
from pagedserve.shared.protocol.step import ExecuteMessage, StepResultMessage
from pagedserve.shared.protocol.structs import ENCODER, decoder

INTERNAL_MESSAGES: dict[str, Any] = {
    m.TYPE: m for m in (*CONTROL_MESSAGES, ExecuteMessage, StepResultMessage, BlockBatch, BlockReply)
}
PUBLIC_MESSAGES: dict[str, type[BaseModel]] = {**CLIENT_MESSAGES, **SERVER_MESSAGES}
MESSAGES: dict[str, Any] = {**INTERNAL_MESSAGES, **PUBLIC_MESSAGES}

# A reader other than its type's plain decoder: a block batch refuses a bad op alone (blocks.py).
_READERS: dict[type, Callable[[bytes], Any]] = {BlockBatch: read_batch}


def message_table(*types: Any) -> dict[str, Any]:
    """The types one receiver takes, by tag (for `read_message`)."""
    return {t.model_fields["type"].default if issubclass(t, BaseModel) else t.TYPE: t for t in types}


def encode_message(message: Any) -> bytes:
    """The frame of any declared message."""
    if isinstance(message, BaseModel):
        body = message.model_dump()  # every public message's fields hold its `type` tag
        return encode(body["type"], body)
    return encode(message.TYPE, {"body": ENCODER.encode(message)})


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
    body = frame.get("body")
    if type(body) is not bytes:
        raise ProtocolError(
            "bad_frame", f"{kind}: field 'body' must be msgpack bytes, got {type(body).__name__}"
        )
    read = _READERS.get(message_type) or decoder(message_type).decode
    try:
        return read(body)
    except msgspec.DecodeError as exc:  # ValidationError is one: both name the path
        raise ProtocolError("bad_fields", f"{kind}: {exc}") from None
