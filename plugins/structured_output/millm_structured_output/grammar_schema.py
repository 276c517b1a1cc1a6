"""The schema as the grammar is compiled from it: closed objects, post-checked keywords left out.

Two departures from the schema as sent, both in the client's favour:

- **No padding keys.** An object that lists ``properties`` and says nothing of
  ``additionalProperties`` produces only those keys (OpenAI's strict semantics).
  JSON Schema would allow any other key, and a small model asked for such an
  object keeps inventing keys until ``max_tokens``. An object that requires a key
  it does not list stays open, since closing it would accept nothing.
- Keywords a grammar cannot express (``CHECKED_AFTER``, e.g. ``uniqueItems``) are
  left to validation of the finished document.

The schema as sent is what the finished document is validated against.
"""

from __future__ import annotations

from typing import Any

from .schema_subset import CHECKED_AFTER

#: Keywords whose values are schemas (or maps / lists of schemas), walked for nested objects.
_SUBSCHEMA_MAPS = ("properties", "$defs")
_SUBSCHEMA_LISTS = ("anyOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties")


def grammar_schema(schema: Any) -> Any:
    """A copy of ``schema`` to compile: objects with ``properties`` closed, ``CHECKED_AFTER`` keywords dropped."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in CHECKED_AFTER:
            continue
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: grammar_schema(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [grammar_schema(sub) for sub in value]
        elif key in _SUBSCHEMAS:
            out[key] = grammar_schema(value)
        else:
            out[key] = value
    if _closable(out):
        out["additionalProperties"] = False
    return out


def _closable(node: dict[str, Any]) -> bool:
    properties = node.get("properties")
    if not isinstance(properties, dict) or "additionalProperties" in node or "patternProperties" in node:
        return False
    required = node.get("required")
    return not isinstance(required, list) or all(name in properties for name in required)
