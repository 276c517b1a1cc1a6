"""Checking a finished constrained document, independently of the constraint.

Validation uses the schema as sent, formats included (jsonschema's format
checker), so what the grammar cannot express (``uniqueItems``) is caught here.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from typing import TYPE_CHECKING, Any

from .response_format import ResponseFormat

if TYPE_CHECKING:
    import jsonschema

#: ``time`` as the grammar enforces it and pydantic reads it: the offset is optional
#: (``14:30:00`` as well as RFC 3339's ``14:30:00Z``). A document the constraint produced
#: must not fail validation over a difference between the two readings.
_TIME = re.compile(r"^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([zZ]|[+-]([01]\d|2[0-3]):[0-5]\d)?$")


def _is_time(value: object) -> bool:
    return not isinstance(value, str) or _TIME.match(value) is not None


@functools.cache
def format_checker() -> Any:
    """jsonschema's checkers, but ``time`` as above (jsonschema is imported on the first
    validation, not at every server start)."""
    import jsonschema

    checker = copy.deepcopy(jsonschema.Draft202012Validator.FORMAT_CHECKER)
    checker.checks("time")(_is_time)
    return checker


@functools.lru_cache(maxsize=256)
def _validator(schema_key: str) -> jsonschema.Draft202012Validator:
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(schema_key), format_checker=format_checker())


def document_problem(text: str, fmt: ResponseFormat) -> str | None:
    """Why ``text`` is not a valid document for ``fmt``; None when it is."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        return f"the output is not JSON ({exc})"
    if fmt.kind == "json_object" and not isinstance(document, dict):
        return "the output is not a JSON object"
    return _problem(document, fmt.key)


def schema_problem(document: Any, schema: dict[str, Any] | bool) -> str | None:
    """Why ``document`` fails ``schema``; None when it does not."""
    return _problem(document, json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def _problem(document: Any, schema_key: str) -> str | None:
    import jsonschema

    error = jsonschema.exceptions.best_match(_validator(schema_key).iter_errors(document))
    if error is not None:
        where = error.json_path
        return f"the output fails the schema at {where}: {error.message}"
    return None
