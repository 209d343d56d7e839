"""The codec of internal messages: msgspec Structs, encoded and checked by msgspec in one pass in C.

Every internal message travels as the `body` of a frame (`codec.encode`): msgpack bytes that msgspec
wrote from the Struct and reads back into it, checking every type on the way (a bad one raises
msgspec.ValidationError naming its path, such as `$.ops[3][2]`). Public messages stay pydantic
(frontend.py): users write those as JSON. The one pydantic type inside an internal message, a
request's StructuredOutputs, crosses as its JSON-able dump.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from pagedserve.shared.protocol.constraints import StructuredOutputs


def _encode_custom(value: Any) -> Any:
    if isinstance(value, StructuredOutputs):
        return value.model_dump()
    raise NotImplementedError(f"no wire form for {type(value).__name__}")


def _decode_custom(kind: type, value: Any) -> Any:
    if kind is StructuredOutputs:
        return StructuredOutputs.model_validate(value)  # a pydantic error becomes msgspec's, naming the path
    raise NotImplementedError(f"no wire form for {kind.__name__}")


ENCODER = msgspec.msgpack.Encoder(enc_hook=_encode_custom)


@functools.cache
def decoder(kind: Any) -> msgspec.msgpack.Decoder[Any]:
    """The decoder of one declared type (built once: a Decoder compiles its type's checks)."""
    return msgspec.msgpack.Decoder(kind, dec_hook=_decode_custom)
