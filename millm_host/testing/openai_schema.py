"""Validate responses against OpenAI's own published schemas.

The schemas are extracted from OpenAI's OpenAPI document by
``tools/extract_openai_schemas.py`` (3.0 ``nullable`` rewritten for jsonschema).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

_PATHS = (Path(__file__).with_name("openai_schemas.json"), Path(__file__).with_name("openai_responses_schemas.json"))


@cache
def _defs(name: str) -> dict[str, Any]:
    """The definitions of the file that holds ``name`` (the Responses API's have a file of their own)."""
    for path in _PATHS:
        defs = _read(path)
        if name in defs:
            return defs
    raise KeyError(f"no OpenAI schema {name!r}")


@cache
def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())["$defs"]


def validate_openai(name: str, instance: Any) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``instance`` matches OpenAI's schema ``name``."""
    schema = {"$ref": f"#/$defs/{name}", "$defs": _defs(name)}
    jsonschema.Draft202012Validator(schema).validate(instance)


@cache
def _event_schemas() -> dict[str, str]:
    """The schema name of each Responses stream event ``type``."""
    defs = _defs("ResponseStreamEvent")
    names = {}
    for option in defs["ResponseStreamEvent"]["anyOf"]:
        name = option["$ref"].rsplit("/", 1)[1]
        for kind in defs[name].get("properties", {}).get("type", {}).get("enum", ()):
            names[kind] = name
    return names


def validate_openai_event(event: Any) -> None:
    """Validate a Responses stream event against the schema of its ``type`` (a readable failure), then the union."""
    validate_openai(_event_schemas()[event["type"]], event)
    validate_openai("ResponseStreamEvent", event)
