"""Chat messages -> prompt token ids, through the tokenizer's own chat template.

The template is rendered to text and then tokenized without special tokens, as vLLM does: the
template writes BOS and the turn markers itself, and adding them again would change the prompt.
"""

from __future__ import annotations

import json
from typing import Any

from pagedserve.services.api.errors import APIError
from pagedserve.services.api.model_card import ModelCard
from pagedserve.services.api.schemas import ChatMessage


def _turn(message: ChatMessage) -> dict[str, Any]:
    """One message as templates take it: tool calls with their arguments as a mapping (the form
    Hugging Face templates expect), a tool result with the id of the call it answers."""
    turn: dict[str, Any] = {"role": message.role, "content": message.text()}
    if message.tool_calls:
        turn["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        turn["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        turn["name"] = message.name
    return turn


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def render_chat(
    card: ModelCard,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    *,
    continue_final_message: bool = False,
) -> list[int]:
    """`template_kwargs` (chat_template_kwargs) reach the template as variables (`enable_thinking`)."""
    text = render_chat_text(
        card,
        messages,
        add_generation_prompt,
        tools,
        template_kwargs,
        continue_final_message=continue_final_message,
    )
    assert card.tokenizer is not None  # render_chat_text refuses a card without one
    return list(card.tokenizer.encode(text, add_special_tokens=False))


def render_chat_text(
    card: ModelCard,
    messages: list[ChatMessage] | list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    *,
    continue_final_message: bool = False,
) -> str:
    """The prompt as text (turns as ChatMessages, or dicts already in the templates' shape)."""
    tokenizer = card.tokenizer
    if tokenizer is None or not tokenizer.chat_template:
        raise APIError(
            400,
            f"model {card.name!r} has no chat template; use /v1/completions with a prompt",
            "messages",
            "no_chat_template",
        )
    turns = [m if isinstance(m, dict) else _turn(m) for m in messages]
    reserved = {
        "tools",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "messages",
        "conversation",
    }
    clash = sorted(reserved & set(template_kwargs or {}))
    if clash:
        raise APIError(
            400,
            f"chat_template_kwargs: {', '.join(clash)} are set by the request itself",
            "chat_template_kwargs",
            "invalid_value",
        )
    try:
        return tokenizer.render_chat(
            turns,
            tools=tools,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message,
            **(template_kwargs or {}),
        )
    except Exception as exc:  # noqa: BLE001 -- a template may refuse a turn order (its raise_exception)
        raise APIError(
            400, f"messages: the chat template refused them: {exc}", "messages", "invalid_value"
        ) from None
