"""A request's output constraint, as the client states it: vLLM's `structured_outputs` fields.

Exactly one kind is set. The constraint is request state like any sampling field: it travels in
SamplingParams (the worker receives it once, with the request) and is compiled into a grammar by
services/constraints. Only its shape is checked here; whether a schema, regex or grammar compiles is
checked by the scheduler before the request is queued (a clear error naming the field).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

MAX_CONSTRAINT_CHARS = 1 << 16
MAX_CHOICES = 256

KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


class StructuredOutputs(BaseModel):
    """`json`: a JSON schema (object or its text); `json_object`: any JSON object; `regex`; `choice`: one
    of these strings; `grammar`: EBNF (GBNF-style `root ::= ...`); `structural_tag`: xgrammar's
    structural tag (JSON), for tool calls inside free text. `disable_any_whitespace` (default on here):
    JSON is generated compact, so a weak model cannot spend its tokens on whitespace."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: Annotated[str, StringConstraints(min_length=1, max_length=MAX_CONSTRAINT_CHARS)] | None = None
    choice: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] | None = Field(
        default=None, min_length=1, max_length=MAX_CHOICES
    )
    grammar: Annotated[str, StringConstraints(min_length=1, max_length=MAX_CONSTRAINT_CHARS)] | None = None
    structural_tag: dict[str, Any] | str | None = None
    disable_any_whitespace: bool = True
    # The constraint starts once the output holds these tokens (a reasoning block's `</think>`); the
    # output before them is free. None: from the first token. Not part of the grammar (cache_key).
    starts_after: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, min_length=1, max_length=16)

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [k for k in KINDS if self.value_of(k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of {', '.join(KINDS)}; got {', '.join(given) if given else 'none'}"
            )
        for kind in ("json", "structural_tag"):
            value = self.value_of(kind)
            if isinstance(value, str) and len(value) > MAX_CONSTRAINT_CHARS:
                raise ValueError(f"{kind}: longer than {MAX_CONSTRAINT_CHARS} characters")
        return self

    def value_of(self, kind: str) -> Any:
        return self.json_ if kind == "json" else getattr(self, kind)

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if self.value_of(k) not in (None, False))

    def cache_key(self) -> str:
        """One string per distinct constraint (a schema's key order does not matter)."""
        return json.dumps(
            [self.kind, self.value_of(self.kind), self.disable_any_whitespace], sort_keys=True, default=str
        )
