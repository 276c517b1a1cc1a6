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

_PATH = Path(__file__).with_name("openai_schemas.json")


@cache
def _document() -> dict[str, Any]:
    return json.loads(_PATH.read_text())


def validate_openai(name: str, instance: Any) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``instance`` matches OpenAI's schema ``name``."""
    schema = {"$ref": f"#/$defs/{name}", "$defs": _document()["$defs"]}
    jsonschema.Draft202012Validator(schema).validate(instance)
