"""The generic tool-call format, for a model whose chat template shows no tools in a format read here.

As llama.cpp's server does (its "generic" chat format): the tools are described
in a system message and the whole reply is one JSON object, constrained with
llguidance to one of

- ``{"tool_calls": [{"name": …, "arguments": {…}}, …]}`` (``parallel_tool_calls``, the default),
- ``{"tool_call": {"name": …, "arguments": {…}}}`` (``parallel_tool_calls: false``, or a named
  function, which OpenAI calls exactly once),
- ``{"response": "…"}``, an answer in words (``tool_choice: "auto"`` only),

each call's ``arguments`` held to that function's ``parameters`` schema.
History is written in the same shapes: an assistant's calls as that JSON, a
tool's result as a user message ``{"tool_response": {…}}`` (templates without
tool support rarely accept a ``tool`` role).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..response_format import ResponseFormat
from .formats import ParsedCall, call_from
from .request import ToolRequest

#: llguidance ignores (and warns about) keywords it cannot enforce instead of
#: refusing the tools: a client's function schema is a hint, not a contract.
_LENIENT = {"lenient": True}


@dataclass(frozen=True)
class GenericReply:
    """A parsed reply: the calls it makes, or the answer it gives (``response``)."""

    calls: list[ParsedCall]
    response: str | None = None


def reply_format(request: ToolRequest) -> ResponseFormat:
    """The constraint on a reply to ``request`` (cached by its schema like any response_format)."""
    return ResponseFormat("json_schema", "tool_call", reply_schema(request))


def reply_schema(request: ToolRequest) -> dict[str, Any]:
    """The JSON Schema of every reply ``request`` allows."""
    offered = [t["function"] for t in request.tools if request.forced in (None, t["function"]["name"])]
    defs = {f"tool_{i}": _arguments_schema(f.get("parameters"), f"tool_{i}") for i, f in enumerate(offered)}
    shapes = [
        _object(
            {"name": {"const": f["name"]}, "arguments": {"$ref": f"#/$defs/tool_{i}"}},
        )
        for i, f in enumerate(offered)
    ]
    one = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
    call = _object(
        {"tool_call": one} if request.one_call else {"tool_calls": {"type": "array", "items": one, "minItems": 1}}
    )
    reply = call if request.choice != "auto" else {"anyOf": [call, _object({"response": {"type": "string"}})]}
    return {"x-guidance": _LENIENT, "$defs": defs, **reply}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _arguments_schema(parameters: dict[str, Any] | None, name: str) -> dict[str, Any]:
    """A function's parameters, moved under ``#/$defs/<name>`` (local refs follow).

    Objects that list properties and say nothing else are closed where the reply
    schema is compiled (``grammar_schema``), as a ``response_format``'s are.
    """
    if parameters is None:  # OpenAI: a function that takes no arguments
        return _object({})
    return _rewrite(parameters, f"#/$defs/{name}")


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = (
    "items",
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)


def _rewrite(schema: Any, base: str) -> Any:
    """A copy of ``schema`` with local ``$ref``s rebased under ``base``."""
    if not isinstance(schema, dict):
        return schema  # true/false
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = base + value[1:]
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: _rewrite(v, base) for k, v in value.items()}
        elif isinstance(value, list) and (key in _SCHEMA_LISTS or key == "items"):
            out[key] = [_rewrite(v, base) for v in value]
        elif key in _SCHEMA_ONE:
            out[key] = _rewrite(value, base)
        else:
            out[key] = value
    return out  # objects are closed to their listed keys where every schema is compiled (grammar_schema)


def describe_tools(request: ToolRequest, *, document: bool = False) -> str:
    """The system-message text that shows the tools and the reply's shapes.

    ``document``: a response_format gives the answer's shape (a JSON document) instead of ``{"response": …}``.
    """
    listed = "\n".join(
        json.dumps(
            {
                "name": f["name"],
                **({"description": f["description"]} if f.get("description") else {}),
                "parameters": f.get("parameters") or {"type": "object", "properties": {}},
            },
            ensure_ascii=False,
        )
        for f in (t["function"] for t in request.tools)
    )
    name = request.forced or "<tool name>"
    call = f'{{"name": "{name}", "arguments": {{<arguments>}}}}'
    shape = f'{{"tool_call": {call}}}' if request.one_call else f'{{"tool_calls": [{call}]}} (one or more calls)'
    if request.choice == "function":
        how = f"Call the tool {request.forced}. Reply with a single JSON object and nothing else: {shape}"
    elif request.choice == "required":
        how = f"Call one of the tools. Reply with a single JSON object and nothing else: {shape}"
    else:
        how = f"Reply with a single JSON object and nothing else, either\n- to call tools: {shape}\n" + (
            "- or to answer the user directly: a JSON document in the requested format"
            if document
            else '- or to answer the user directly: {"response": "<your answer>"}'
        )
    return f"You can call these tools (each with the JSON Schema of its arguments):\n{listed}\n\n{how}"


def show_tools(conversation: list[dict[str, Any]], text: str, template: str | None) -> None:
    """Add ``text`` to the conversation's system message (one is added if there is none).

    A template that never mentions a system role gets the text at the head of the
    first user message instead.
    """
    first = conversation[0] if conversation else None
    if first is not None and first.get("role") == "system":
        first["content"] = f"{first.get('content') or ''}\n\n{text}".lstrip()
    elif template is not None and "system" not in template:
        user = next((m for m in conversation if m.get("role") == "user"), None)
        if user is not None:
            user["content"] = f"{text}\n\n{user.get('content') or ''}"
            return
        conversation.insert(0, {"role": "user", "content": text})
    else:
        conversation.insert(0, {"role": "system", "content": text})


def render_calls(calls: list[dict[str, Any]], parallel: bool) -> str:
    """An assistant's ``tool_calls`` (as ``history.add_tool_history`` left them) written as the reply shape."""
    written = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
    if parallel or len(written) != 1:
        return json.dumps({"tool_calls": written}, ensure_ascii=False)
    return json.dumps({"tool_call": written[0]}, ensure_ascii=False)


def write_generic_history(conversations: list[list[dict[str, Any]]], parallel: bool) -> None:
    """Calls become JSON content, tool results become user messages, both in the generic shapes."""
    for conversation in conversations:
        names: dict[str, str] = {}
        for message in conversation:
            calls = message.pop("tool_calls", None)
            if calls:
                names.update((c["id"], c["function"]["name"]) for c in calls if c.get("id"))
                before = message.get("content") or ""
                message["content"] = (before + "\n" if before else "") + render_calls(calls, parallel)
            call_id = message.pop("tool_call_id", None)
            if message.get("role") == "tool":
                result: dict[str, Any] = {}
                if call_id is not None:
                    result["tool_call_id"] = call_id
                    if call_id in names:
                        result["name"] = names[call_id]
                result["content"] = message.get("content") or ""
                message["role"] = "user"
                message["content"] = json.dumps({"tool_response": result}, ensure_ascii=False)


def parse_reply(text: str) -> GenericReply | None:
    """The calls or the answer in a whole reply; None when it is not one of the shapes."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or len(obj) != 1:
        return None
    if isinstance(obj.get("response"), str):
        return GenericReply([], obj["response"])
    items = obj.get("tool_calls") if "tool_calls" in obj else [obj.get("tool_call")]
    if not isinstance(items, list) or not items:
        return None
    calls = [call_from(item, ("arguments", "parameters")) for item in items]
    if not all(calls):
        return None
    return GenericReply([c for c in calls if c is not None])
