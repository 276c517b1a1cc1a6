"""Reading a request's ``response_format`` into the constraint it asks for."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from millm_host.api import InvalidParameter

from .errors import ResponseFormatUnsupported
from .schema_subset import check_subset

PARAM = "response_format"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ResponseFormat:
    """A constrained reply: ``json_object`` or ``json_schema`` (with its name).

    ``lark``: a whole llguidance grammar compiled instead of ``schema`` (``tools``
    with a response_format: calls or the document, ``tools/grammar.py``).
    """

    kind: str
    name: str | None
    schema: dict[str, Any] | bool
    lark: str | None = None

    @cached_property
    def key(self) -> str:
        """The schema as canonical JSON (or the grammar): what compiled constraints are cached by."""
        if self.lark is not None:
            return "lark:" + self.lark
        return json.dumps(self.schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_response_format(value: Any) -> ResponseFormat | None:
    """The constraint ``value`` asks for; None for ``text`` or no value.

    Raises ``InvalidParameter`` for a malformed value and
    ``ResponseFormatUnsupported`` for a schema outside the supported subset.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidParameter("response_format must be an object", param=PARAM)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object", None, JSON_OBJECT_SCHEMA)
    if kind != "json_schema":
        raise InvalidParameter(
            f"response_format.type must be text, json_object or json_schema, not {kind!r}", param=f"{PARAM}.type"
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidParameter("response_format.json_schema must be an object", param=f"{PARAM}.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidParameter(
            "response_format.json_schema.name must be 1-64 letters, digits, '_' or '-'",
            param=f"{PARAM}.json_schema.name",
        )
    for field, kinds in (("strict", bool), ("description", str)):
        if spec.get(field) is not None and not isinstance(spec[field], kinds):
            raise InvalidParameter(
                f"response_format.json_schema.{field} has the wrong type", param=f"{PARAM}.json_schema.{field}"
            )
    schema = spec.get("schema")
    if not isinstance(schema, (dict, bool)):
        raise InvalidParameter(
            "response_format.json_schema.schema must be a JSON Schema object", param=f"{PARAM}.json_schema.schema"
        )
    check_schema(schema)
    return ResponseFormat("json_schema", name, schema)


def check_schema(schema: dict[str, Any] | bool) -> None:
    """Refuse a schema outside the subset (each keyword by pointer) or not a valid JSON Schema."""
    problems = check_subset(schema)
    if problems:
        raise ResponseFormatUnsupported(
            "response_format.json_schema.schema cannot be enforced: " + "; ".join(p.describe() for p in problems),
            param=PARAM,
            extra={"unsupported": [{"keyword": p.keyword, "pointer": p.pointer, "reason": p.reason} for p in problems]},
        )
    import jsonschema  # on the first response_format, not at every server start

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/" + "/".join(str(p) for p in exc.path) if exc.path else "(root)"
        raise InvalidParameter(
            f"response_format.json_schema.schema is not a valid JSON Schema at {where}: {exc.message}",
            param=f"{PARAM}.json_schema.schema",
        ) from None
