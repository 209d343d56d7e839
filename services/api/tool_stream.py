"""One streamed choice's deltas when tools are in play, in OpenAI's chunk shape.

A named call streams its arguments as they are generated (the first delta names the call). `auto`
streams content at once and each call when its block closes. `required` is one JSON array: its calls
go out when it is complete (a cut-short array has none).
"""

from __future__ import annotations

from typing import Any

from pagedserve.services.api.tool_parsers import ParsedCall, new_parser
from pagedserve.services.api.tools import ToolMode, call_id, required_calls


class ChoiceToolStream:
    def __init__(self, mode: ToolMode, parser: str) -> None:
        self.mode = mode
        self._parser = new_parser(parser) if mode.kind == "auto" else None
        self._text = ""  # required: the array so far
        self.num_calls = 0

    def _calls(self, calls: list[ParsedCall]) -> list[dict[str, Any]]:
        out = []
        for call in calls:
            out.append(
                {
                    "tool_calls": [
                        {
                            "index": self.num_calls,
                            "id": call_id(),
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        }
                    ]
                }
            )
            self.num_calls += 1
        return out

    def delta(self, text: str) -> list[dict[str, Any]]:
        """The delta bodies `text` adds (maybe none: text held back until a call closes)."""
        kind = self.mode.kind
        if kind == "named":
            if self.num_calls == 0:
                self.num_calls = 1
                call = {"index": 0, "id": call_id(), "type": "function"}
                return [{"tool_calls": [{**call, "function": {"name": self.mode.name, "arguments": text}}]}]
            return [{"tool_calls": [{"index": 0, "function": {"arguments": text}}]}] if text else []
        if kind == "required":
            self._text += text
            return []
        if self._parser is not None:
            content, calls = self._parser.feed(text)
            return ([{"content": content}] if content else []) + self._calls(calls)
        return [{"content": text}] if text else []

    def finish(self) -> list[dict[str, Any]]:
        if self.mode.kind == "required":
            return self._calls(required_calls(self._text))
        if self._parser is not None:
            rest = self._parser.finish()
            return [{"content": rest}] if rest else []
        return []
