"""Chat templates rendered by jinja2 as transformers renders them, without importing transformers.

The environment is the one `apply_chat_template` builds: a sandbox whose values cannot be changed
in place (templates are code from the Hub), `trim_blocks` and `lstrip_blocks`, loop controls
(`break`, `continue`), the `{% generation %}` block (rendered as its body), a `tojson` that keeps
non-ASCII text and takes `indent`, `separators` and `sort_keys`, and the globals `raise_exception`,
`strftime_now`, `dict` and a `namespace` that refuses underscore names. The conversation is
prepared as transformers 5 prepares it: keys whose value is None are dropped, a message's
reasoning is offered under `reasoning_content` and `thinking` too, and `continue_final_message`
cuts the prompt right after the last message's text. tests/unit/api/test_text_tokenizer_parity.py
checks the rendered prompts against transformers' own.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's text for training masks;
    a prompt only needs its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


class _Dict:
    """`dict(...)` and `dict.fromkeys(...)`, without the type itself (no attribute tricks)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace, refusing underscore-prefixed names (a way into CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 -- jinja's signature: namespace(self=...)
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Not jinja's own filter: that one escapes HTML characters, which no prompt wants.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def pick_template(templates: str | dict[str, str], tools: list[Any] | None) -> str:
    """One template of a checkpoint's named set: `tool_use` when tools are given and it has one,
    else `default`."""
    if isinstance(templates, str):
        return templates
    if tools is not None and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    raise ValueError(f"the model has several chat templates and no default: {sorted(templates)}")


def _prepared(message: dict[str, Any]) -> dict[str, Any]:
    turn = {key: value for key, value in message.items() if value is not None}
    reasoning = next((turn[k] for k in _REASONING_FIELDS if turn.get(k) is not None), None)
    if reasoning is not None:
        turn = {"thinking": reasoning, **turn, "reasoning_content": reasoning}
    return turn


def render_template(
    template: str,
    messages: list[dict[str, Any]],
    variables: dict[str, Any],
    *,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
) -> str:
    """The prompt text. `variables` are the special tokens (`bos_token`...) and the request's
    template kwargs, which win over them. jinja2's TemplateError (raise_exception among them) and
    ValueError say why a conversation cannot be rendered."""
    if not messages:
        raise ValueError("cannot render an empty conversation")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be set")
    chat = [_prepared(copy.deepcopy(m)) for m in messages]  # a copy: the tag below edits it
    final = ""
    if continue_final_message:
        final = _tag_final(chat, template)
    rendered = compile_template(template).render(
        messages=chat,
        tools=tools,
        documents=documents,
        add_generation_prompt=add_generation_prompt,
        **variables,
    )
    if not continue_final_message:
        return rendered
    if final.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
        raise ValueError("continue_final_message: the chat template does not keep the final message's text")
    at = rendered.rindex(_CONTINUE_TAG.strip())
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()  # the template trimmed the message's trailing space


def _tag_final(chat: list[dict[str, Any]], template: str) -> str:
    """Mark where the last message's text ends (the prompt is cut there); its text."""
    last = chat[-1]
    final = last.get("content")
    if final is None:
        raise ValueError('continue_final_message: the final message has no "content" to continue')
    if "content" not in template:
        raise ValueError('continue_final_message: the chat template does not read "content"')
    if isinstance(final, list):
        for block in reversed(final):
            if isinstance(block, dict) and "text" in block:
                final = block["text"]
                block["text"] = block["text"] + _CONTINUE_TAG
                return str(final)
        raise ValueError("continue_final_message: the final message has no text to continue")
    last["content"] = final + _CONTINUE_TAG
    return str(final)
