"""Responses input items, tools and tool_choice -> the chat request they mean (and 400s naming the item).

- A message item (`role` user/system/developer/assistant, content a string or input_text/output_text
  parts) is a chat turn; developer turns are system turns for the template.
- `function_call` items join the assistant turn before them as its tool calls; `function_call_output`
  is a tool turn answering its call_id.
- `reasoning` items are dropped: chat templates leave past thinking out of the prompt.
- Anything else (web_search_call, file_search_call, item_reference, images, files...) is a 400
  naming the item and its type: only text and function tools are served.
"""

from __future__ import annotations

from typing import Any

from pagedserve.services.api.chat_translation import function_tools, joined_text
from pagedserve.services.api.errors import APIError
from pagedserve.services.api.schemas import ChatMessage, FunctionCall, NamedToolChoice, Tool, ToolCall

TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
ROLES = ("user", "system", "developer", "assistant")


def _bad(field: str, message: str) -> APIError:
    return APIError(400, f"{field}: {message}", field, "invalid_value")


def _unsupported(field: str, kind: str, what: str) -> APIError:
    return APIError(
        400,
        f"{field}: {what} {kind!r} is not supported here (text and function tools only)",
        field,
        "unsupported",
    )


def _text(content: Any, field: str) -> str:
    return joined_text(
        content,
        field,
        TEXT_PARTS,
        "content parts",
        lambda where, kind: _unsupported(where, str(kind), "content part type"),
    )


def normalize_items(given: str | list[dict[str, Any]], field: str = "input") -> list[dict[str, Any]]:
    """The request's input as checked items of the kinds we serve (what the store keeps)."""
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    items = []
    for i, item in enumerate(given):
        where = f"{field}[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise _bad(f"{where}.role", f"must be one of {', '.join(ROLES)}; got {role!r}")
            items.append(
                {
                    "type": "message",
                    "role": role,
                    "content": _text(item.get("content", ""), f"{where}.content"),
                }
            )
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise _bad(f"{where}.{key}", "must be a string")
            items.append({k: item[k] for k in ("type", "call_id", "name", "arguments")})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise _bad(f"{where}.call_id", "must be a string")
            output = _text(item.get("output", ""), f"{where}.output")
            items.append({"type": "function_call_output", "call_id": item["call_id"], "output": output})
        elif kind == "reasoning":
            continue
        else:
            raise _unsupported(where, str(kind), "item type")
    return items


def chat_messages(items: list[dict[str, Any]], instructions: str | None) -> list[ChatMessage]:
    """Checked items (normalize_items, or stored outputs) -> chat turns, instructions first."""
    turns: list[ChatMessage] = []
    if instructions:
        turns.append(ChatMessage(role="system", content=instructions))
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            turns.append(ChatMessage(role=role, content=item["content"]))
        elif kind == "function_call":
            call = ToolCall(
                id=item["call_id"], function=FunctionCall(name=item["name"], arguments=item["arguments"])
            )
            last = turns[-1] if turns else None
            if last is not None and last.role == "assistant" and last.tool_call_id is None:
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                turns.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif kind == "function_call_output":
            turns.append(ChatMessage(role="tool", content=item["output"], tool_call_id=item["call_id"]))
    if not turns:
        raise _bad("input", "holds no message")
    return turns


def _function(tool: dict[str, Any], field: str) -> dict[str, Any]:
    """A Responses function tool is flat: chat's function is its fields but `type`."""
    kind = tool.get("type")
    if kind != "function":
        raise _unsupported(field, str(kind), "tool type")  # a built-in tool (web_search...)
    return {k: v for k, v in tool.items() if k != "type"}


def chat_tools(tools: list[dict[str, Any]] | None) -> list[Tool] | None:
    """Responses' flat function tools -> chat's nested ones; a built-in tool is a 400 naming it."""
    return function_tools(tools, _function)


def chat_tool_choice(choice: str | dict[str, Any] | None) -> Any:
    if choice is None or isinstance(choice, str):
        if choice not in (None, "none", "auto", "required"):
            raise _bad("tool_choice", f"must be none, auto, required or a function; got {choice!r}")
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise _unsupported("tool_choice", str(choice.get("type")), "tool_choice type")
    return NamedToolChoice.of(choice["name"])


def output_as_items(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as input items of the next turn (what previous_response_id adds)."""
    items: list[dict[str, Any]] = []
    for item in output:
        if item["type"] == "message":
            text = "".join(part["text"] for part in item["content"])
            items.append({"type": "message", "role": "assistant", "content": text})
        elif item["type"] == "function_call":
            items.append({k: item[k] for k in ("type", "call_id", "name", "arguments")})
    return items
