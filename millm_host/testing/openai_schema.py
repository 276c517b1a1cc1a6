"""Validate a response body against a schema of OpenAI's own API specification.

The specification (``shared/reference/openai-openapi.json``, beside the
repository) mixes OpenAPI 3.0's ``nullable`` into 3.1; it is rewritten as
``anyOf [..., null]`` before validating with jsonschema.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

SPEC_PATH = Path("shared") / "reference" / "openai-openapi.json"


def find_openai_spec(start: Path | None = None) -> Path | None:
    """The OpenAI specification in ``shared/`` beside the repository (or any folder above)."""
    here = (start or Path(__file__)).resolve()
    for folder in here.parents:
        candidate = folder / SPEC_PATH
        if candidate.is_file():
            return candidate
    return None


def _without_nullable(node: Any) -> Any:
    if isinstance(node, list):
        return [_without_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _without_nullable(value) for key, value in node.items()}
    if node.pop("nullable", False) is True:
        return {"anyOf": [node, {"type": "null"}]}
    return node


@functools.cache
def _document(path: str) -> dict[str, Any]:
    return _without_nullable(json.loads(Path(path).read_text()))


def validate_openai(instance: Any, schema_name: str, spec: Path | None = None) -> None:
    """Raise ``jsonschema.ValidationError`` if ``instance`` breaks ``components.schemas[schema_name]``."""
    import jsonschema

    path = spec or find_openai_spec()
    if path is None:
        raise FileNotFoundError(f"{SPEC_PATH} was not found above {Path(__file__).parent}")
    schema = dict(_document(str(path)))
    schema["$ref"] = f"#/components/schemas/{schema_name}"
    jsonschema.Draft202012Validator(schema).validate(instance)
