"""A StructuredOutputs -> an xgrammar Grammar (no tokenizer needed), or one error naming the field.

The scheduler calls `check_constraint` before a request is queued: parsing a schema, regex or EBNF is
cheap (well under a millisecond for common schemas) and catches every syntax error; compiling it
against the vocabulary is the worker's job (compiler.py).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any

import xgrammar as xgr

from pagedserve.shared.protocol.constraints import StructuredOutputs

# xgrammar prefixes its messages with "[hh:mm:ss] /path/file.cc:123: ".
_LOG_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")
_CHECKED_LIMIT = 512
# xgrammar 0.2.8 writes the characters of a length-bounded JSON string (maxLength / minLength) as
# [^"\\\r\n], which lets raw control characters through (invalid JSON; strict parsers such as
# pydantic's refuse it). Its unbounded strings exclude \0-\x1f; we make the bounded ones do so too.
_LAX_STRING_CHARS = r"[^\"\\\r\n]"
_STRICT_STRING_CHARS = r"[^\0-\x1f\"\\\r\n]"


class ConstraintError(ValueError):
    """`field` is the constraint's field as the client named it (structured_outputs.json, ...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _clean(exc: BaseException) -> str:
    text = str(exc).strip()
    return _LOG_PREFIX.sub("", text.splitlines()[0] if text else type(exc).__name__)


def schema_text(value: dict[str, Any] | str) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def choice_ebnf(choices: list[str]) -> str:
    """`root ::= "a" | "b"`: each choice a literal (JSON escapes are EBNF's escapes too)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def json_grammar(schema: str, any_whitespace: bool) -> xgr.Grammar:
    grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=any_whitespace)
    ebnf = str(grammar)
    if _LAX_STRING_CHARS not in ebnf:
        return grammar
    return xgr.Grammar.from_ebnf(ebnf.replace(_LAX_STRING_CHARS, _STRICT_STRING_CHARS))


def grammar_of(spec: StructuredOutputs) -> xgr.Grammar:
    """The constraint as an xgrammar Grammar; ConstraintError naming the field if it does not parse."""
    kind = spec.kind
    field = f"structured_outputs.{kind}"
    value = spec.value_of(kind)
    try:
        if kind in ("json", "json_object"):
            schema = schema_text(value) if kind == "json" else '{"type": "object"}'
            return json_grammar(schema, any_whitespace=not spec.disable_any_whitespace)
        if kind == "regex":
            return xgr.Grammar.from_regex(value)
        if kind == "choice":
            return xgr.Grammar.from_ebnf(choice_ebnf(value))
        if kind == "grammar":
            return xgr.Grammar.from_ebnf(value)
        return xgr.Grammar.from_structural_tag(schema_text(value))
    except Exception as exc:  # xgrammar raises RuntimeError / ValueError / TypeError for bad input
        raise ConstraintError(field, _clean(exc)) from None


class ConstraintChecker:
    """Parses each distinct constraint once; a bounded memory of those that passed."""

    def __init__(self, limit: int = _CHECKED_LIMIT) -> None:
        self._passed: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def check(self, spec: StructuredOutputs) -> None:
        key = spec.cache_key()
        if key in self._passed:
            self._passed.move_to_end(key)
            return
        grammar_of(spec)
        self._passed[key] = None
        if len(self._passed) > self._limit:
            self._passed.popitem(last=False)


_checker = ConstraintChecker()


def check_constraint(spec: StructuredOutputs | None) -> None:
    if spec is not None:
        _checker.check(spec)
