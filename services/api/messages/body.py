"""The message Anthropic returns, built block by block from the output reader's pieces.

`ContentBlocks` turns pieces (reasoning, text, tool calls) into content blocks, and on the way into
the streaming events: `content_block_start`, deltas (`thinking_delta`, `text_delta`,
`input_json_delta`), `content_block_stop`. An unstreamed message is built by the same class, its
events dropped, so both carry the same blocks.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pagedserve.services.api.output_reader import Piece

Event = dict[str, Any]
_BLOCK_OF = {"reasoning": "thinking", "text": "text", "call": "tool_use"}


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


class ContentBlocks:
    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._json = ""  # the open tool_use block's input so far, as JSON text

    def add(self, piece: Piece) -> list[Event]:
        events: list[Event] = []
        kind = _BLOCK_OF.get(piece.kind)
        if kind is not None and (self._open is None or self._open["type"] != kind or kind == "tool_use"):
            events += self.close()
            events.append(self._start(kind, piece))
        if not piece.text:
            return events
        block = self._open
        assert block is not None, f"{piece.kind} without an open block"
        index = len(self.blocks) - 1
        if block["type"] == "thinking":
            block["thinking"] += piece.text
            delta = {"type": "thinking_delta", "thinking": piece.text}
        elif block["type"] == "text":
            block["text"] += piece.text
            delta = {"type": "text_delta", "text": piece.text}
        else:
            self._json += piece.text
            delta = {"type": "input_json_delta", "partial_json": piece.text}
        return events + [{"type": "content_block_delta", "index": index, "delta": delta}]

    def _start(self, kind: str, piece: Piece) -> Event:
        if kind == "thinking":
            block: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == "text":
            block = {"type": "text", "text": ""}
        else:
            block = {
                "type": "tool_use",
                "id": f"toolu_{piece.call_id.removeprefix('call_')}",
                "name": piece.name,
                "input": {},
            }
        self.blocks.append(block)
        self._open, self._json = block, ""
        return {"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(block)}

    def close(self) -> list[Event]:
        block = self._open
        if block is None:
            return []
        self._open = None
        if block["type"] == "tool_use":
            try:
                block["input"] = json.loads(self._json) if self._json else {}
            except ValueError:
                block["input"] = {"_unparsed": self._json}  # cut short: what there was, not lost
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    @property
    def calls_tools(self) -> bool:
        return any(b["type"] == "tool_use" for b in self.blocks)


def stop_reason(finish_reason: str, calls_tools: bool, stop_sequence: str | None) -> str:
    if finish_reason == "length":
        return "max_tokens"
    if calls_tools:
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def message_body(
    mid: str,
    model: str,
    blocks: list[dict[str, Any]],
    reason: str | None,
    stop_sequence: str | None,
    usage: dict[str, int],
) -> dict[str, Any]:
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": stop_sequence,
        "usage": usage,
    }


def usage_body(input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
    }
