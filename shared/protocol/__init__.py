"""The wire: every message type of pagedserve, declared once.

- `frontend`: client SDK <-> scheduler (pydantic, validated on arrival: a trust boundary).
- `step`: scheduler <-> worker hot path (slotted dataclasses, flat lists, no per-field validation).
- `blocks`: scheduler / worker <-> block manager batches (the same plain style).
- `codec`: msgpack frames `{"v": 1, "type": ..., ...}`; one error type for any bad frame.
"""

from pagedserve.shared.protocol.codec import PROTOCOL_VERSION, ProtocolError, decode, encode

__all__ = ["PROTOCOL_VERSION", "ProtocolError", "decode", "encode"]
