"""Anthropic messages, tools and tool_choice -> the chat request they mean (and 400s naming the block).

- `system` (a string or text blocks) is the first, system turn.
- A user message's text blocks are its text; its `tool_result` blocks become tool turns (answering
  `tool_use_id`) placed before that text, as the conversation happened.
- An assistant message's text is its content, its `tool_use` blocks its tool calls (input as JSON);
  `thinking` blocks are dropped, as chat templates drop past reasoning.
- Images, documents, server tools and Anthropic-defined client tools are a 400 naming the block.
- tool_choice: auto -> auto, any -> required, tool -> that function, none -> none;
  `disable_parallel_tool_use` -> parallel_tool_calls false. thinking.type -> enable_thinking.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from pagedserve.services.api.chat_translation import function_tools, joined_text
from pagedserve.services.api.errors import APIError, describe_validation
from pagedserve.services.api.messages.schemas import CountTokensRequest, MessagesRequest
from pagedserve.services.api.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    NamedToolChoice,
    Tool,
    ToolCall,
)

T = TypeVar("T")
THINKING = ("thinking", "redacted_thinking")  # past reasoning: chat templates leave it out


def _bad(field: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, f"{field}: {message}", field, code)


def _unsupported(where: str, kind: Any, served: str = "text") -> APIError:
    return _bad(where, f"block type {kind!r} is not supported here ({served} only)", "unsupported")


def _text_of(content: Any, field: str) -> str:
    """A string, or text blocks (tool results may hold them) -> the text."""
    return joined_text(content, field, ("text",), "content blocks", _unsupported)


def _blocks(
    content: list[dict[str, Any]],
    field: str,
    other: str,
    read: Callable[[dict[str, Any], str], T],
    dropped: tuple[str, ...] = (),
) -> tuple[list[str], list[T]]:
    """A message's blocks -> its texts, and its `other` blocks as `read(block, where)` makes them, in
    order; `dropped` kinds are left out, any other kind is a 400 naming the block."""
    texts, others = [], []
    for j, block in enumerate(content):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == other:
            others.append(read(block, f"{field}[{j}]"))
        elif kind not in dropped:
            raise _unsupported(f"{field}[{j}]", kind, f"text and {other}")
    return texts, others


def _tool_turn(block: dict[str, Any], where: str) -> ChatMessage:
    """A tool_result block -> the tool turn answering its tool_use_id."""
    if not isinstance(block.get("tool_use_id"), str):
        raise _bad(f"{where}.tool_use_id", "must be a string")
    text = _text_of(block.get("content", ""), f"{where}.content")
    if block.get("is_error"):
        text = f"Error: {text}"
    return ChatMessage(role="tool", content=text, tool_call_id=block["tool_use_id"])


def _tool_call(block: dict[str, Any], where: str) -> ToolCall:
    """A tool_use block -> the tool call, its input as JSON arguments."""
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise _bad(where, "a tool_use block needs a string id and name")
    arguments = json.dumps(block.get("input", {}))
    return ToolCall(id=block["id"], function=FunctionCall(name=block["name"], arguments=arguments))


def _user_turns(content: Any, field: str) -> list[ChatMessage]:
    if isinstance(content, str):
        return [ChatMessage(role="user", content=content)]
    texts, results = _blocks(content, field, "tool_result", _tool_turn)
    return results + ([ChatMessage(role="user", content="".join(texts))] if texts else [])


def _assistant_turn(content: Any, field: str) -> ChatMessage:
    if isinstance(content, str):
        return ChatMessage(role="assistant", content=content)
    texts, calls = _blocks(content, field, "tool_use", _tool_call, THINKING)
    return ChatMessage(role="assistant", content="".join(texts) or None, tool_calls=calls or None)


def chat_turns(body: CountTokensRequest) -> list[ChatMessage]:
    turns = []
    if body.system:
        turns.append(ChatMessage(role="system", content=_text_of(body.system, "system")))
    for i, message in enumerate(body.messages):
        field = f"messages[{i}].content"
        if message.role == "user":
            turns += _user_turns(message.content, field)
        elif message.role == "assistant":
            turns.append(_assistant_turn(message.content, field))
        else:
            raise _bad(f"messages[{i}].role", f"must be user or assistant; got {message.role!r}")
    return turns


def _custom_function(tool: dict[str, Any], field: str) -> dict[str, Any]:
    """A custom tool -> chat's function: its input_schema is the parameters."""
    kind = tool.get("type", "custom")
    if kind != "custom" or "input_schema" not in tool:
        raise _bad(
            field,
            f"tool type {kind!r} is not supported here (custom tools with an input_schema only)",
            "unsupported",
        )
    return {
        "name": tool.get("name"),
        "description": tool.get("description"),
        "parameters": tool["input_schema"],
    }


def chat_tools(tools: list[dict[str, Any]] | None) -> list[Tool] | None:
    return function_tools(tools, _custom_function)


def chat_tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    """-> (chat tool_choice, parallel_tool_calls)."""
    if choice is None:
        return None, None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return NamedToolChoice.of(choice["name"]), parallel
    raise _bad("tool_choice.type", f"must be auto, any, tool (with a name) or none; got {kind!r}")


def output_format(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """output_config.format (Anthropic's structured outputs) -> chat's response_format."""
    fmt = (config or {}).get("format")
    if fmt is None:
        return None
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        raise _bad("output_config.format", 'must be {"type": "json_schema", "schema": {...}}')
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def refuse_unserved(body: CountTokensRequest) -> None:
    for name in ("mcp_servers", "context_management", "container"):
        if getattr(body, name):
            raise _bad(name, "is not supported here", "unsupported")


def chat_request(body: CountTokensRequest, stream: bool = False) -> ChatCompletionRequest:
    refuse_unserved(body)
    choice, parallel = chat_tool_choice(body.tool_choice)
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": chat_turns(body),
        "tools": chat_tools(body.tools),
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
        "stream": stream,
    }
    if body.thinking is not None:
        fields["chat_template_kwargs"] = {"enable_thinking": body.thinking.get("type") != "disabled"}
    if isinstance(body, MessagesRequest):
        fields |= {
            "max_tokens": body.max_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": body.top_k,
            "stop": body.stop_sequences or None,
            # The stop sequence that matched is named in the answer: it is kept, then cut (stop.py).
            "include_stop_str_in_output": bool(body.stop_sequences),
        }
        fields["response_format"] = output_format(body.output_config)
        user = body.user_profile_id or (body.metadata or {}).get("user_id")
        if isinstance(user, str) and user:
            fields["user"] = user[:256]
    try:
        return ChatCompletionRequest(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        message, param = describe_validation(exc.errors())
        raise APIError(400, message, param, "invalid_value") from None
