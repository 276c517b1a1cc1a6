"""LFM2's Python calls as grammar rules: ``name(key=value, …)``, each value held to its property's schema.

LFM2 writes ``[get_weather(city="Paris")]``. A function whose ``parameters`` is
an object of listed ``properties``, closed to them (as every compiled schema
is, ``grammar_schema``), can be written so and held to its schema: the keywords
in the order the schema lists them, the required ones always, each value JSON
(which ``formats.PythonicFormat`` reads) held to that property's schema.
Anything else (other keys allowed, a property name that is no Python
identifier, a schema that is not such an object, a ``$ref`` outside ``$defs``)
cannot be, and ``kwargs_calls`` says so.
"""

from __future__ import annotations

import json
import keyword
from typing import Any

from ..grammar_schema import grammar_schema
from ..schema_subset import ANNOTATIONS

_OBJECT_KEYS = frozenset({"type", "properties", "required", "additionalProperties", "$defs", *ANNOTATIONS})


def kwargs_calls(functions: list[dict[str, Any]], layout: dict[str, Any]) -> list[str] | None:
    """Rules that define ``call``: one call to any of ``functions``; None when one cannot be written so.

    ``layout``: the ``x-guidance`` options of each value's JSON.
    """
    rules: list[str] = []
    for i, function in enumerate(functions):
        written = _function(f"f{i}", function, layout)
        if written is None:
            return None
        rules.extend(written)
    return [f"call: {' | '.join(f'f{i}' for i in range(len(functions)))}", *rules]


def _function(rule: str, function: dict[str, Any], layout: dict[str, Any]) -> list[str] | None:
    """``rule: "name(" arguments ")"`` and the rules it uses."""
    parameters = function.get("parameters")
    head = json.dumps(function["name"] + "(")
    if parameters is None:  # OpenAI: a function that takes no arguments
        return [f'{rule}: {head} ")"']
    schema = grammar_schema(parameters)
    if not _keyword_object(schema):
        return None
    defs = schema.get("$defs") or {}
    required = set(schema.get("required") or ())
    names = [name for name, sub in schema["properties"].items() if sub is not False]
    if not names:
        return [f'{rule}: {head} ")"']
    rules = []
    for k, name in enumerate(names):
        value = schema["properties"][name]
        value = {} if value is True else value
        if defs:
            value = {"$defs": defs, **value}
        rules.append(f"{rule}_a{k}: {json.dumps(name + '=')} %json {json.dumps({**value, 'x-guidance': layout})}")
    for k in range(1, len(names)):  # what follows argument k-1: the rest, in order, each after ", "
        item = f'", " {rule}_a{k}'
        then = f" {rule}_r{k + 1}" if k + 1 < len(names) else ""
        rules.append(f"{rule}_r{k}: {item}{then}" if names[k] in required else f"{rule}_r{k}: ({item})?{then}")
    firsts = []  # the first argument written: any up to and including the first required one
    for k, name in enumerate(names):
        firsts.append(f"{rule}_a{k}" + (f" {rule}_r{k + 1}" if k + 1 < len(names) else ""))
        if name in required:
            break
    arguments = " | ".join(firsts)
    optional = not required
    rules.insert(0, f'{rule}: {head} ({arguments}){"?" if optional else ""} ")"')
    return rules


def _keyword_object(schema: Any) -> bool:
    """Whether ``schema`` (compiled form) is an object of listed properties, each a Python keyword argument."""
    if not isinstance(schema, dict) or not set(schema) <= _OBJECT_KEYS:
        return False
    properties, required = schema.get("properties"), schema.get("required") or []
    if schema.get("type", "object") != "object" or schema.get("additionalProperties") is not False:
        return False
    if not isinstance(properties, dict) or not isinstance(required, list) or not set(required) <= set(properties):
        return False
    if any(not name.isidentifier() or keyword.iskeyword(name) for name in properties):
        return False
    if any(isinstance(sub, dict) and "$defs" in sub for sub in properties.values()):
        return False
    if any(properties[name] is False for name in required):
        return False  # a required argument no value satisfies
    return all(ref.startswith("#/$defs/") for ref in _refs(properties))


def _refs(node: Any) -> list[str]:
    """Every ``$ref`` string under ``node``."""
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []
