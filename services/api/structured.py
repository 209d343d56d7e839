"""The request's ways of asking for structured output -> one StructuredOutputs, or a 400 naming the field.

OpenAI's `response_format` (json_object, json_schema), vLLM's `structured_outputs` extra and its older
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` fields. At most one may be given.
Whether a schema, regex or grammar compiles is the scheduler's check (before it queues anything);
its refusal comes back as a 400 whose `param` is the request's own field (`constraint_errors`). The
API itself stays free of the grammar engine (and of the torch it imports).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from pagedserve.services.api.errors import APIError, describe_validation
from pagedserve.shared.protocol.constraints import StructuredOutputs

GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def _spec(fields: dict[str, Any], param: str) -> StructuredOutputs:
    try:
        return StructuredOutputs.model_validate(fields)
    except ValidationError as exc:
        message, field = describe_validation(exc.errors(), drop_prefix=())
        raise APIError(
            400, f"{param}: {message}", param if field is None else f"{param}.{field}", "invalid_value"
        ) from None


@dataclass(frozen=True, slots=True)
class Constraint:
    """The request's constraint and the request field it came from (what a refusal names)."""

    spec: StructuredOutputs
    field: str


# The scheduler's refusal names its own field: "sampling.structured_outputs.regex: <why>".
_SCHEDULER_FIELD = re.compile(r"^sampling\.structured_outputs(\.\w+)?: ")


@contextmanager
def constraint_errors(constraint: Constraint | None) -> Iterator[None]:
    """Inside: the scheduler's `invalid_constraint` refusal is re-told under the request's field."""
    try:
        yield
    except APIError as exc:
        if exc.code != "invalid_constraint" or constraint is None:
            raise
        why = _SCHEDULER_FIELD.sub("", exc.message)
        raise APIError(400, f"{constraint.field}: {why}", constraint.field, exc.code) from None


def response_format_spec(fmt: dict[str, Any]) -> Constraint | None:
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(StructuredOutputs(json_object=True), "response_format")
    if kind == "json_schema":
        inner = fmt.get("json_schema")
        if not isinstance(inner, dict) or not isinstance(inner.get("schema", {}), dict):
            raise APIError(
                400,
                "response_format.json_schema must be an object with a 'schema' object",
                "response_format.json_schema",
                "invalid_value",
            )
        # strict or not, the schema is enforced: a constraint is exact by construction.
        schema = inner.get("schema") or {"type": "object"}
        return Constraint(
            _spec({"json": schema}, "response_format.json_schema"), "response_format.json_schema.schema"
        )
    raise APIError(
        400,
        f"response_format.type must be one of text, json_object, json_schema; got {kind!r}",
        "response_format.type",
        "invalid_value",
    )


def request_constraint(req: Any) -> Constraint | None:
    """The one constraint the request asks for (None: none), from whichever field it used."""
    found: list[tuple[str, Constraint]] = []
    fmt = getattr(req, "response_format", None)
    if fmt is not None:
        constraint = response_format_spec(fmt)
        if constraint is not None:
            found.append(("response_format", constraint))
    if req.structured_outputs is not None:
        spec = _spec(req.structured_outputs, "structured_outputs")
        found.append(("structured_outputs", Constraint(spec, f"structured_outputs.{spec.kind}")))
    for name, kind in GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            found.append((name, Constraint(_spec({kind: value}, name), name)))
    if len(found) > 1:
        names = ", ".join(n for n, _ in found)
        raise APIError(400, f"give at most one output constraint; got {names}", found[1][0], "invalid_value")
    return found[0][1] if found else None
