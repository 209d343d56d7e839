"""Chat messages -> prompt token ids, through the tokenizer's own chat template.

The template is rendered to text and then tokenized without special tokens, as vLLM does: the
template writes BOS and the turn markers itself, and adding them again would change the prompt.
"""

from __future__ import annotations

from pagedserve.services.api.errors import APIError
from pagedserve.services.api.model_card import ModelCard
from pagedserve.services.api.schemas import ChatMessage


def render_chat(card: ModelCard, messages: list[ChatMessage], add_generation_prompt: bool) -> list[int]:
    tokenizer = card.tokenizer
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise APIError(
            400,
            f"model {card.name!r} has no chat template; use /v1/completions with a prompt",
            "messages",
            "no_chat_template",
        )
    turns = [{"role": m.role, "content": m.text()} for m in messages]
    try:
        text = tokenizer.apply_chat_template(
            turns, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except (
        Exception
    ) as exc:  # a template may raise on a turn order it does not allow (jinja's raise_exception)
        raise APIError(
            400, f"messages: the chat template refused them: {exc}", "messages", "invalid_value"
        ) from None
    return list(tokenizer.encode(text, add_special_tokens=False))
