"""The body of POST /v1/responses, as pydantic: a trust boundary, unknown fields are errors.

`input` items, `tools` and `tool_choice` are kept as plain JSON here and read by items.py, which
knows each kind by its `type` and refuses the ones we do not serve by name (`input[3]: item type
'web_search_call' is not supported`). Fields OpenAI defines that change nothing here (`store`,
`include`, `metadata`, ...) are accepted and echoed; the ones that would change the answer and are
not served (`background`, `conversation`, `prompt`) are refused when set.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Body):
    format: TextFormat = Field(default_factory=TextFormat)
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(_Body):
    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    previous_response_id: str | None = Field(default=None, max_length=128)
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    user: str | None = Field(default=None, max_length=256)
    store: bool = True
    metadata: dict[str, str] | None = None
    # Accepted, echoed where OpenAI echoes them, no effect here.
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = Field(
        default=None, ge=0, le=0
    )  # logprobs of output text are not served (0 only)
    # Refused unless unset (they would change the answer and are not served).
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    # vLLM's extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    priority: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Our extension, as on chat/completions (docs/speculative-decoding.md)
    speculate: bool | None = None
    num_speculative_tokens: int | None = None
