"""Reading tool calls out of a model's free text (tool_choice "auto"), one parser per model family.

A parser is fed the text as it streams and hands back what is plain content and which calls have
closed, so a streamed response can send content at once and each call as soon as it is complete.
`--tool-call-parser` names the parser; add one by adding a class to PARSERS.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it


@dataclass(slots=True)
class HermesParser:
    """Hermes / Qwen style: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks in the text.
    A block that does not hold such a JSON object stays content (the model's text, not a call)."""

    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"
    _pending: str = ""  # text not yet sent: inside a block, or what may be the start of one
    _inside: bool = False
    calls: list[ParsedCall] = field(default_factory=list)

    def feed(self, text: str) -> tuple[str, list[ParsedCall]]:
        """New text -> (content to send now, calls that closed)."""
        self._pending += text
        content, closed = "", []
        while True:
            if not self._inside:
                at = self._pending.find(self.OPEN)
                if at < 0:
                    keep = _partial_suffix(self._pending, self.OPEN)
                    content += self._pending[: len(self._pending) - keep]
                    self._pending = self._pending[len(self._pending) - keep :]
                    return content, closed
                content += self._pending[:at]
                self._pending = self._pending[at + len(self.OPEN) :]
                self._inside = True
            end = self._pending.find(self.CLOSE)
            if end < 0:
                return content, closed
            body, self._pending = self._pending[:end], self._pending[end + len(self.CLOSE) :]
            self._inside = False
            call = _call_of(body)
            if call is None:
                content += self.OPEN + body + self.CLOSE
            else:
                closed.append(call)
                self.calls.append(call)

    def finish(self) -> str:
        """The end of the text: whatever is still held back is content (an unclosed block included)."""
        rest = (self.OPEN if self._inside else "") + self._pending
        self._pending, self._inside = "", False
        return rest


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _call_of(body: str) -> ParsedCall | None:
    try:
        obj: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    return ParsedCall(obj["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


PARSERS = {"hermes": HermesParser}


def check_parser(name: str) -> None:
    if name not in PARSERS:
        raise ValueError(f"tool_call_parser must be one of {', '.join(PARSERS)}; got {name!r}")


def new_parser(name: str) -> HermesParser:
    check_parser(name)
    return PARSERS[name]()
