"""The body of POST /v1/messages (and count_tokens), as pydantic: a trust boundary.

Content blocks stay plain JSON here and are read by convert.py, which knows each block by its `type`
and refuses the ones not served by name (images, documents, server tools). Fields a coding agent
sends that change nothing here (`metadata`, `service_tier`, `cache_control` on blocks) are accepted;
the ones that would change the answer and are not served are refused when set.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str
    content: str | list[dict[str, Any]]


class CountTokensRequest(_Body):
    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=128)
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    # Refused unless unset: not served.
    mcp_servers: list[dict[str, Any]] | None = None
    context_management: dict[str, Any] | None = None
    container: str | dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = (
        None  # format (json_schema) constrains the answer; effort is ignored
    )
    user_profile_id: str | None = Field(None, max_length=256)  # whom the request is for (per-user limits)
    # Accepted, no effect here.
    service_tier: str | None = None
    cache_control: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    inference_geo: str | None = None
    speed: str | None = None
    workspace_id: str | None = None
