"""POST /tokenize and /detokenize (vLLM's shapes), GET /version.

/tokenize takes a `prompt` (tokenized as /v1/completions would: special tokens added unless told
not to) or chat `messages` (rendered by the model's chat template as /v1/chat/completions renders
them, `chat_template_kwargs` and `tools` included). Both run here, in the API process: the same
tokenizer the scheduler holds, no request to it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from pagedserve.services.api.chat_template import render_chat
from pagedserve.services.api.errors import APIError
from pagedserve.services.api.schemas import ChatMessage, TokenIds, Tool
from pagedserve.services.api.state import api_state, check_model

router = APIRouter()
version_router = APIRouter()


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = (
        None  # default: true for a prompt, false for messages (the template writes them)
    )
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: TokenIds


def _tokenizer(request: Request, model: str | None) -> Any:
    state = api_state(request)
    if model is not None:
        check_model(state, model)
    if state.card.tokenizer is None:
        raise APIError(400, f"model {state.card.name!r} has no tokenizer", "model", "no_tokenizer")
    return state.card.tokenizer


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    tokenizer = _tokenizer(request, body.model)
    card = api_state(request).card
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of prompt or messages", "prompt", "invalid_value")
    if body.messages is not None:
        tools = None if not body.tools else [t.model_dump(exclude_none=True) for t in body.tools]
        tokens = render_chat(
            card,
            body.messages,
            body.add_generation_prompt,
            tools,
            body.chat_template_kwargs,
            continue_final_message=body.continue_final_message,
        )
        if body.add_special_tokens:  # asked for on top of what the template wrote
            tokens = tokenizer.build_inputs_with_special_tokens(tokens)
    else:
        special = True if body.add_special_tokens is None else body.add_special_tokens
        tokens = list(tokenizer.encode(body.prompt, add_special_tokens=special))
    return {
        "count": len(tokens),
        "max_model_len": card.max_model_len,
        "tokens": tokens,
        "token_strs": tokenizer.convert_ids_to_tokens(tokens) if body.return_token_strs else None,
    }


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    tokenizer = _tokenizer(request, body.model)
    vocab = len(tokenizer)
    bad = next((t for t in body.tokens if t >= vocab), None)
    if bad is not None:
        raise APIError(
            400,
            f"tokens holds {bad}, outside the tokenizer's vocabulary [0, {vocab})",
            "tokens",
            "invalid_value",
        )
    return {"prompt": tokenizer.decode(body.tokens)}


@version_router.get("/version")
async def server_version() -> dict[str, str]:
    try:
        return {"version": version("pagedserve")}
    except PackageNotFoundError:  # run from a source tree that was never installed
        return {"version": "unknown"}
