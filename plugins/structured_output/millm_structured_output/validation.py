"""Checking a finished constrained document, independently of the constraint.

Validation uses the schema as sent, formats included (jsonschema's format
checker), so what the grammar cannot express (``uniqueItems``) is caught here.
"""

from __future__ import annotations

import copy
import functools
import json
import re

import jsonschema

from .response_format import ResponseFormat

#: jsonschema's checkers, but ``time`` as the grammar enforces it and pydantic reads it: the
#: offset is optional (``14:30:00`` as well as RFC 3339's ``14:30:00Z``). A document the
#: constraint produced must not fail validation over a difference between the two readings.
_TIME = re.compile(r"^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([zZ]|[+-]([01]\d|2[0-3]):[0-5]\d)?$")
FORMAT_CHECKER = copy.deepcopy(jsonschema.Draft202012Validator.FORMAT_CHECKER)


@FORMAT_CHECKER.checks("time")
def _is_time(value: object) -> bool:
    return not isinstance(value, str) or _TIME.match(value) is not None


@functools.lru_cache(maxsize=256)
def _validator(schema_key: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(schema_key), format_checker=FORMAT_CHECKER)


def document_problem(text: str, fmt: ResponseFormat) -> str | None:
    """Why ``text`` is not a valid document for ``fmt``; None when it is."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        return f"the output is not JSON ({exc})"
    if fmt.kind == "json_object" and not isinstance(document, dict):
        return "the output is not a JSON object"
    error = jsonschema.exceptions.best_match(_validator(fmt.key).iter_errors(document))
    if error is not None:
        where = error.json_path
        return f"the output fails the schema at {where}: {error.message}"
    return None
