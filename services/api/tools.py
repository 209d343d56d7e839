"""`tools` and `tool_choice`: what constrains the output, and how the output becomes tool calls.

- none: the tools are only shown to the template; the output is content.
- auto: the model decides; its text is read by the tool-call parser (tool_parsers.py).
- required: the output is constrained to a JSON array of one or more `{"name", "parameters"}` objects,
  each `parameters` matching its tool's schema (one item at most when parallel_tool_calls is false).
- a named function: the output is constrained to that function's parameters schema; it *is* the
  call's arguments.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from pagedserve.services.api.errors import APIError
from pagedserve.services.api.schemas import ChatCompletionRequest, NamedToolChoice, Tool
from pagedserve.services.api.structured import Constraint, request_constraint
from pagedserve.services.api.tool_parsers import ParsedCall
from pagedserve.shared.protocol.constraints import StructuredOutputs

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True, slots=True)
class ToolMode:
    """How one request's output relates to tools: kind is none, auto, required or named."""

    kind: str
    name: str | None = None  # the named function

    @property
    def calls_tools(self) -> bool:
        return self.kind != "none"


def _parameters(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters or ANY_OBJECT


def tool_mode(req: ChatCompletionRequest) -> ToolMode:
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", "tool_choice", "invalid_value")
        return ToolMode("none")
    if isinstance(choice, NamedToolChoice):
        names = [t.function.name for t in req.tools]
        if choice.function.name not in names:
            raise APIError(
                400,
                f"tool_choice names {choice.function.name!r}, which is not among tools ({', '.join(names)})",
                "tool_choice",
                "invalid_value",
            )
        return ToolMode("named", choice.function.name)
    return ToolMode(choice or "auto")


def chat_constraint(req: ChatCompletionRequest, mode: ToolMode) -> Constraint | None:
    """The chat request's one constraint: from tool_choice (required, named) or from its output
    format fields; both at once is a 400."""
    by_tools = tool_constraint(req, mode)
    asked = request_constraint(req)
    if by_tools is not None and asked is not None:
        raise APIError(
            400,
            f"tool_choice {mode.kind!r} constrains the output to tool calls; it cannot be combined with "
            f"{asked.field.split('.')[0]}",
            "tool_choice",
            "invalid_value",
        )
    return by_tools or asked


def tool_constraint(req: ChatCompletionRequest, mode: ToolMode) -> Constraint | None:
    tools = req.tools or []
    if mode.kind == "named":
        tool = next(t for t in tools if t.function.name == mode.name)
        index = tools.index(tool)
        return Constraint(StructuredOutputs(json=_parameters(tool)), f"tools[{index}].function.parameters")
    if mode.kind != "required":
        return None
    items = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.function.name}, "parameters": _parameters(t)},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }
    schema: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if req.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return Constraint(StructuredOutputs(json=schema), "tools")


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_body(call: ParsedCall, index: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    if index is not None:
        body["index"] = index
    return body


def required_calls(text: str) -> list[ParsedCall]:
    """The constrained JSON array of a `required` response -> its calls (none if it was cut short)."""
    try:
        items = json.loads(text)
    except ValueError:
        return []
    return [ParsedCall(i["name"], json.dumps(i["parameters"])) for i in items if isinstance(i, dict)]


def template_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools as chat templates take them (OpenAI's shape, as plain dicts)."""
    return None if not req.tools else [t.model_dump(exclude_none=True) for t in req.tools]
