"""The request bodies of the OpenAI API, as pydantic models: a trust boundary.

Unknown fields are errors (a typo never passes silently); fields OpenAI defines that we do not
implement yet are accepted by name only so that they can be refused with a message saying so.
Ranges are checked when the request becomes our SamplingParams, so each limit lives in one place.
vLLM's extra sampling fields (top_k, min_p, repetition_penalty, ...) are accepted as vLLM does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Stop = str | list[str] | None
TokenIds = list[Annotated[int, Field(ge=0)]]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """Fields both endpoints share; None means "the default"."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: Stop = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    # vLLM's extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    stop_token_ids: TokenIds | None = None
    include_stop_str_in_output: bool = False
    priority: int | None = None
    # OpenAI fields we refuse with a clear message rather than ignore
    logit_bias: dict[str, float] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    # A string, or a list of parts; only text parts exist here (images would need a vision model).
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    # Refused unless text: structured outputs and tools are not implemented yet.
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
