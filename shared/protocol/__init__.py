"""The wire: every message type of pagedserve, declared once.

- `frontend`: client SDK <-> scheduler (pydantic, validated on arrival: a trust boundary).
- `step`: scheduler <-> worker hot path (msgspec Structs: flat lists, encoded and type-checked in C).
- `blocks`: scheduler <-> block manager batches (plain lists in slotted dataclasses), built and read by its functions.
- `control`: hello, heartbeat, register, reset, renew_owner, pools... (dataclasses, fields checked).
- `messages`: every type above by its `type` tag; `encode_message` / `read_message`.
- `codec`: msgpack frames `{"v": 1, "type": ..., ...}`; one error type for any bad frame.
"""

from pagedserve.shared.protocol.codec import PROTOCOL_VERSION, ProtocolError, decode, encode

__all__ = ["PROTOCOL_VERSION", "ProtocolError", "decode", "encode"]
