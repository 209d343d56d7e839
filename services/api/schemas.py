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
    logit_bias: dict[str, float] | None = None
    # Our extension (docs/speculative-decoding.md): speculative decoding off, or a lower cap, per request
    speculate: bool | None = None
    num_speculative_tokens: int | None = None
    # Structured output: OpenAI's response_format, vLLM's structured_outputs and guided_* (structured.py)
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


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


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCall(_Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # A string, or a list of parts; only text parts exist here (images would need a vision model).
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDefinition(_Body):
    name: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction

    @classmethod
    def of(cls, name: str) -> NamedToolChoice:
        """The choice of the function `name` (what the Responses and Messages shapes name by a string)."""
        return cls(type="function", function=NamedFunction(name=name))


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: variables for the template (enable_thinking)
