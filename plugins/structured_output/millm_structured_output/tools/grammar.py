"""The one grammar for a reply in a model family's own call syntax: every call held to its function's schema.

A template that shows tools in a format read here (``formats.py``) gets one
llguidance grammar (lark) for the whole reply; the generic format has its own
JSON Schema (``generic.py``), or, with a ``response_format``, a grammar built
here too. What ``start`` allows:

| tool_choice         | no response_format                       | a response_format  |
|---------------------|------------------------------------------|--------------------|
| ``auto``            | ``text``, or calls (``text`` rules below) | ``calls | answer`` |
| ``required``, named | ``calls``                                | ``calls``          |

``answer`` is the response_format's JSON; ``calls`` is written in the syntax
the model's template shows:

| Format   | ``calls``                                                        | ``text`` (auto)                          |
|----------|------------------------------------------------------------------|------------------------------------------|
| Hermes   | ``<tool_call>\\n{"name", "arguments"}\\n</tool_call>``, one a line | any, then calls (no ``<tool_call>`` in it) |
| Llama 3  | ``{"name", "parameters"}``, ``; `` between calls                 | a reply not opening with ``{``           |
| LFM2     | ``<|tool_call_start|>[f(a=…), …]<|tool_call_end|>``             | a reply not opening with ``[``; calls may be followed by text |
| generic  | the generic format's call shapes (``tools/generic.py``)         | (its own ``{"response": …}``)            |

``text`` never holds a call marker, so nothing the model writes as text can be
read as a call. LFM2's keyword arguments are held to the schema one by one
(``kwargs.py``); functions whose parameters cannot be written as keyword
arguments make it write its JSON variant (``[{"name", "arguments"}, …]``),
which its parser also reads. A call marker that is a special token of the
model's tokenizer is matched as that token. Every call's arguments are held to
its function's ``parameters`` (leniently, as in the generic format, unless the
function is ``strict``: ``strict.py``); the answer to the response_format's
schema exactly. A forced call is forced by the grammar, not by text written into
the prompt.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from ..constraint import JSON_LAYOUT
from ..grammar_schema import grammar_schema
from ..response_format import ResponseFormat
from .formats import HERMES, LLAMA3_JSON, PYTHONIC, CallFormat
from .generic import _arguments_schema, _object, reply_schema
from .kwargs import kwargs_calls
from .request import ToolRequest

_LENIENT_LAYOUT = {**JSON_LAYOUT, "lenient": True}
#: Any text (``.`` matching newlines too).
_ANY = "(?s:.*)"


def tools_format(
    request: ToolRequest, call_format: CallFormat | None, answer: ResponseFormat | None, tokenizer: Any
) -> ResponseFormat:
    """The constraint for a reply to ``request``, which may also answer with ``answer``'s document.

    ``call_format`` None: the generic call shapes (only with ``answer``: without one, ``generic.reply_format``).
    ``tokenizer``: the model's, to find special call markers.
    """
    free_text = request.choice == "auto" and answer is None
    if free_text and call_format is None:
        raise ValueError("the generic format without a response_format is generic.reply_format")
    rules = _calls(request, call_format, tokenizer, after_text=free_text)
    if free_text:
        assert call_format is not None
        rules[:0] = _text(call_format)
    elif request.choice == "auto":
        assert answer is not None
        document = {} if answer.schema is True else grammar_schema(answer.schema)
        rules.insert(0, "start: calls | answer")
        rules.append(f"answer: %json {json.dumps({**document, 'x-guidance': JSON_LAYOUT})}")
    else:
        rules.insert(0, "start: calls")
    return ResponseFormat("tools", answer.name if answer is not None else None, True, lark="\n".join(rules) + "\n")


def _calls(request: ToolRequest, call_format: CallFormat | None, tokenizer: Any, *, after_text: bool) -> list[str]:
    """Rules that define ``calls``: every call the request allows, in ``call_format``'s syntax.

    ``after_text``: the calls may follow text (Hermes: text ends where the first ``<tool_call>`` begins).
    """
    if call_format is None:
        calls = request if request.choice != "auto" else replace(request, choice="required")
        return [f"calls: {_json(reply_schema(calls))}"]
    many = not request.one_call
    if call_format is HERMES:
        start, newline = _marker(tokenizer, HERMES.start), _str(chr(10))
        body = f"{newline} {_json(_call_schema(request, 'arguments'))} {newline} {_marker(tokenizer, HERMES.end)}"
        rules = [
            f"calls: {'lead' if after_text else start} body" + (f" ({newline} call)*" if many else ""),
            f"call: {start} body",
            f"body: {body}",
        ]
        if after_text:  # a lazy lead ends at the first marker: the text before it holds none
            special = start.startswith("<[")
            rules.append(f"lead: TEXT {start}" if special else f"lead[lazy]: /{_ANY}{_regex(HERMES.start)}/")
        return rules if many else [r for r in rules if not r.startswith("call:")]
    if call_format is LLAMA3_JSON:
        call = _json(_call_schema(request, "parameters"))
        return [f"calls: {call} ({_str('; ')} {call})*" if many else f"calls: {call}"]
    if call_format is PYTHONIC:
        # some parameters cannot be keyword arguments: LFM2's JSON variant
        call_rules = kwargs_calls(_offered(request), _LENIENT_LAYOUT) or [
            f"call: {_json(_call_schema(request, 'arguments'))}"
        ]
        items = 'call (", " call)*' if many else "call"
        start, end = _marker(tokenizer, PYTHONIC.start), _marker(tokenizer, PYTHONIC.end)
        return [f'calls: {start} "[" {items} "]" {end}', *call_rules]
    raise ValueError(f"no grammar for the {call_format.name} call format")


def _text(call_format: CallFormat) -> list[str]:
    """``tool_choice: "auto"``: ``start`` and the text it allows instead of (or with) calls in ``call_format``.

    The text can never be read as a call: it holds no call marker, and where a
    format reads a reply that opens with ``{`` or ``[`` as calls, it does not open so.
    """
    if call_format is HERMES:
        return ["start: TEXT | calls", f"TEXT: {_without(HERMES.start)}"]
    if call_format is LLAMA3_JSON:
        return ["start: TEXT | calls", r"TEXT: /\s*([^\s{]" + _ANY + ")?/"]
    if call_format is PYTHONIC:  # LFM2 writes text after its calls
        opening_text = r"/\s*([^\s\[]" + _ANY + ")?/"
        return [
            "start: TEXT | calls TAIL",
            f"TEXT: {opening_text} & ~/{_ANY}{_regex(PYTHONIC.start)}{_ANY}/",
            f"TAIL: {_without(PYTHONIC.start)}",
        ]
    raise ValueError(f"no grammar for the {call_format.name} call format")


def _offered(request: ToolRequest) -> list[dict[str, Any]]:
    """The functions a call may name (the forced one only)."""
    return [t["function"] for t in request.tools if request.forced in (None, t["function"]["name"])]


def _call_schema(request: ToolRequest, arguments_key: str) -> dict[str, Any]:
    """One call ``{"name": …, "<arguments_key>": {…}}`` to any offered function (the forced one only)."""
    offered = _offered(request)
    defs = {f"tool_{i}": _arguments_schema(f.get("parameters"), f"tool_{i}") for i, f in enumerate(offered)}
    shapes = [
        _object({"name": {"const": f["name"]}, arguments_key: {"$ref": f"#/$defs/tool_{i}"}})
        for i, f in enumerate(offered)
    ]
    one = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
    return {"$defs": defs, **one}


def _json(schema: dict[str, Any]) -> str:
    """A ``%json`` rule: the schema closed as every compiled schema is, in the one layout."""
    return f"%json {json.dumps({**grammar_schema(schema), 'x-guidance': _LENIENT_LAYOUT})}"


def _str(text: str) -> str:
    return json.dumps(text)


def _regex(text: str) -> str:
    """``text`` as a literal inside ``/…/``."""
    return "".join("\\" + c if c in r"\.+*?()|[]{}^$#&-~/" else c for c in text)


def _without(marker: str) -> str:
    """A terminal: any text that does not contain ``marker``."""
    return f"/{_ANY}/ & ~/{_ANY}{_regex(marker)}{_ANY}/"


def _marker(tokenizer: Any, text: str) -> str:
    """``text`` as the special token it is in ``tokenizer`` (``<[id]>``), else as literal text."""
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "content", None) == text and getattr(added, "special", False):
            return f"<[{token_id}]>"
    return _str(text)
