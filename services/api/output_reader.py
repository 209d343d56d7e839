"""One completion's text as it streams -> what it is: reasoning, answer text, tool calls.

The reasoning splitter goes first (the thinking block is never parsed for tool calls); the answer then
goes through the tool-call stream of the request's tool mode (tool_stream.py). Every API renders these
pieces in its own shape: chat deltas, Responses events, Anthropic content blocks. A whole output is
read by the same code in one feed, so streamed and unstreamed answers agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pagedserve.services.api.reasoning import ReasoningSplitter, ThinkState
from pagedserve.services.api.tool_stream import ChoiceToolStream
from pagedserve.services.api.tools import ToolMode

PieceKind = Literal["reasoning", "text", "call", "call_args"]


@dataclass(frozen=True, slots=True)
class Piece:
    """`call` opens a tool call (its id, name and first arguments); `call_args` adds to the open one."""

    kind: PieceKind
    text: str = ""
    call_id: str = ""
    name: str = ""
    index: int = 0  # calls: which call of the completion (0, 1, ...)


class OutputReader:
    def __init__(
        self, mode: ToolMode, tool_parser: str, reasoning_parser: str | None, think: ThinkState | None
    ) -> None:
        self._tools = ChoiceToolStream(mode, tool_parser) if mode.calls_tools else None
        self.splitter = ReasoningSplitter(reasoning_parser, think or "none") if reasoning_parser else None
        self.num_calls = 0

    def feed(self, text: str) -> list[Piece]:
        if self.splitter is None:
            return self._answer(text, final=False)
        reasoning, answer = self.splitter.feed(text)
        return ([Piece("reasoning", reasoning)] if reasoning else []) + self._answer(answer, final=False)

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        if self.splitter is not None:
            reasoning, answer = self.splitter.finish()
            pieces += [Piece("reasoning", reasoning)] if reasoning else []
            pieces += self._answer(answer, final=False)
        return pieces + self._answer("", final=True)

    def _answer(self, text: str, final: bool) -> list[Piece]:
        if self._tools is None:
            return [Piece("text", text)] if text else []
        deltas = self._tools.finish() if final else (self._tools.delta(text) if text else [])
        pieces = []
        for delta in deltas:
            if "content" in delta:
                pieces.append(Piece("text", delta["content"]))
                continue
            for call in delta["tool_calls"]:
                function = call["function"]
                if "id" in call:
                    args = function.get("arguments", "")
                    pieces.append(Piece("call", args, call["id"], function["name"], self.num_calls))
                    self.num_calls += 1
                else:
                    pieces.append(Piece("call_args", function.get("arguments", ""), index=self.num_calls - 1))
        return pieces


def read_whole(
    text: str, mode: ToolMode, tool_parser: str, reasoning_parser: str | None, think: ThinkState | None
) -> tuple[str | None, str, list[tuple[str, str, str]]]:
    """A finished output -> (reasoning or None, answer text, [(call id, name, arguments)])."""
    reader = OutputReader(mode, tool_parser, reasoning_parser, think)
    reasoning: list[str] = []
    answer: list[str] = []
    calls: list[list[str]] = []
    for piece in reader.feed(text) + reader.finish():
        if piece.kind == "reasoning":
            reasoning.append(piece.text)
        elif piece.kind == "text":
            answer.append(piece.text)
        elif piece.kind == "call":
            calls.append([piece.call_id, piece.name, piece.text])
        else:
            calls[-1][2] += piece.text
    opened = reader.splitter is not None and reader.splitter.opened
    thought = "".join(reasoning) if opened else None
    return thought, "".join(answer), [(c[0], c[1], c[2]) for c in calls]


def chat_delta(piece: Piece) -> dict[str, object]:
    """A piece as a chat.completion.chunk's delta."""
    if piece.kind == "reasoning":
        return {"reasoning_content": piece.text, "reasoning": piece.text}
    if piece.kind == "text":
        return {"content": piece.text}
    if piece.kind == "call":
        function = {"name": piece.name, "arguments": piece.text}
        return {
            "tool_calls": [
                {"index": piece.index, "id": piece.call_id, "type": "function", "function": function}
            ]
        }
    return {"tool_calls": [{"index": piece.index, "function": {"arguments": piece.text}}]}
