"""One grammar for ``tools`` with a ``response_format``: the reply is tool calls or the document.

OpenAI accepts both in one request: the model either calls tools or answers
with content in the schema. One llguidance grammar (lark) allows exactly that,
``start: calls | answer``, or ``calls`` alone when a call is forced
(``required``, a named function). ``answer`` is the response_format's JSON;
``calls`` is written in the syntax the model's template shows:

| Format   | ``calls``                                                        |
|----------|------------------------------------------------------------------|
| Hermes   | ``<tool_call>\\n{"name", "arguments"}\\n</tool_call>``, one a line |
| Llama 3  | ``{"name", "parameters"}``, ``; `` between calls                 |
| LFM2     | ``<|tool_call_start|>[{"name", "arguments"}, …]<|tool_call_end|>`` |
| generic  | the generic format's call shapes (``tools/generic.py``)         |

LFM2's calls are held to its JSON variant (which its parser reads), since
Python keyword arguments cannot be held to a JSON Schema. A call marker that is
a special token of the model's tokenizer is matched as that token.
Every call's arguments are held to its function's ``parameters`` (leniently, as
in the generic format); the answer to the response_format's schema exactly.
With the grammar in place no call opening is written into the prompt: the
grammar forces the call.
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
from .request import ToolRequest

_LENIENT_LAYOUT = {**JSON_LAYOUT, "lenient": True}


def combined_format(
    request: ToolRequest, call_format: CallFormat | None, answer: ResponseFormat, tokenizer: Any
) -> ResponseFormat:
    """The constraint for a reply to ``request`` that may also answer with ``answer``'s document.

    ``call_format`` None: the generic call shapes. ``tokenizer``: the model's, to find special call markers.
    """
    rules = [f"calls: {_calls(request, call_format, tokenizer)}"]
    if request.choice == "auto":
        document = {} if answer.schema is True else grammar_schema(answer.schema)
        rules.insert(0, "start: calls | answer")
        rules.append(f"answer: %json {json.dumps({**document, 'x-guidance': JSON_LAYOUT})}")
    else:
        rules.insert(0, "start: calls")
    return ResponseFormat("tools", answer.name, True, lark="\n".join(rules) + "\n")


def _calls(request: ToolRequest, call_format: CallFormat | None, tokenizer: Any) -> str:
    if call_format is None:
        calls = request if request.choice != "auto" else replace(request, choice="required")
        return _json(reply_schema(calls))
    many = not request.one_call
    if call_format is HERMES:
        call = f"{_marker(tokenizer, HERMES.start)} {_str(chr(10))} {_json(_call_schema(request, 'arguments'))} "
        call += f"{_str(chr(10))} {_marker(tokenizer, HERMES.end)}"
        return f"({call}) ({_str(chr(10))} {call})*" if many else call
    if call_format is LLAMA3_JSON:
        call = _json(_call_schema(request, "parameters"))
        return f"{call} ({_str('; ')} {call})*" if many else call
    if call_format is PYTHONIC:
        call = _json(_call_schema(request, "arguments"))
        items = f"{call} ({_str(', ')} {call})*" if many else call
        return f'{_marker(tokenizer, PYTHONIC.start)} "[" {items} "]" {_marker(tokenizer, PYTHONIC.end)}'
    raise ValueError(f"no grammar for the {call_format.name} call format")


def _call_schema(request: ToolRequest, arguments_key: str) -> dict[str, Any]:
    """One call ``{"name": …, "<arguments_key>": {…}}`` to any offered function (the forced one only)."""
    offered = [t["function"] for t in request.tools if request.forced in (None, t["function"]["name"])]
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


def _marker(tokenizer: Any, text: str) -> str:
    """``text`` as the special token it is in ``tokenizer`` (``<[id]>``), else as literal text."""
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "content", None) == text and getattr(added, "special", False):
            return f"<[{token_id}]>"
    return _str(text)
