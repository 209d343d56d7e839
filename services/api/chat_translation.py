"""What the Anthropic messages and OpenAI Responses translations into a chat request share
(messages/convert.py, responses/items.py): text content and function tools, read with 400s that
name the field as the client wrote it."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from pydantic import ValidationError

from pagedserve.services.api.errors import APIError, describe_validation
from pagedserve.services.api.schemas import Tool


def joined_text(
    content: Any,
    field: str,
    kinds: Collection[str],
    listed: str,
    unsupported: Callable[[str, Any], APIError],
) -> str:
    """A string, or a list of text parts of `kinds` -> the text. Anything else is a 400: `listed`
    names the list the API expects ("content blocks"), `unsupported(where, type)` refuses one part."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{field}: must be a string or a list of {listed}", field, "invalid_value")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise unsupported(f"{field}[{j}]", kind)
        out.append(str(part.get("text", part.get("refusal", ""))))  # a refusal part is its text
    return "".join(out)


def function_tools(
    tools: list[dict[str, Any]] | None, function_of: Callable[[dict[str, Any], str], dict[str, Any]]
) -> list[Tool] | None:
    """The request's tools as chat's (None for none). `function_of(tool, field)` is one tool's
    function (name, description, parameters), or the 400 refusing a kind we do not serve."""
    if not tools:
        return None
    return [_function_tool(function_of(tool, f"tools[{i}]"), f"tools[{i}]") for i, tool in enumerate(tools)]


def _function_tool(function: dict[str, Any], field: str) -> Tool:
    """Chat's function tool; a bad one is a 400 naming its key under `field` (`tools[2].name`)."""
    try:
        return Tool.model_validate({"type": "function", "function": function})
    except ValidationError as exc:
        message, param = describe_validation(exc.errors(), drop_prefix=("function",))
        raise APIError(400, f"{field}.{message}", f"{field}.{param}", "invalid_value") from None
