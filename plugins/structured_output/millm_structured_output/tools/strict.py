"""``strict: true`` on a function: its parameters in the served subset, every call to it checked.

Every call is held to its function's ``parameters`` by a grammar, whatever
``strict`` says (``grammar.py``, ``generic.py``). Without ``strict`` the grammar
is lenient: a keyword the constraint library cannot enforce is ignored, the
schema being a hint. With ``strict: true`` the parameters are held to the
response_format subset (``schema_subset.py``): a keyword outside it is refused
(``400 field_not_honoured``, each keyword named with its JSON pointer), so every
keyword is enforced, token by token or (``uniqueItems``) on the finished call,
which ``call_problem`` checks against the schema as sent.
"""

from __future__ import annotations

import json
from typing import Any

from millm_host.api import FieldNotHonoured, InvalidParameter

from ..schema_subset import check_subset
from ..validation import schema_problem
from .request import ToolRequest


def check_strict(request: ToolRequest) -> None:
    """Refuse a ``strict`` function whose parameters the constraint cannot enforce in full."""
    for i, tool in enumerate(request.tools):
        function = tool["function"]
        if function["name"] not in request.strict or function.get("parameters") is None:
            continue
        where = f"tools[{i}].function.parameters"
        problems = check_subset(function["parameters"])
        if problems:
            raise FieldNotHonoured(
                f"tools[{i}].function.strict cannot be honoured: the parameters use what the constraint cannot "
                "enforce: " + "; ".join(p.describe() for p in problems),
                param=where,
                extra={
                    "unsupported": [{"keyword": p.keyword, "pointer": p.pointer, "reason": p.reason} for p in problems]
                },
            )
        import jsonschema  # on the first strict function, not at every server start

        try:
            jsonschema.Draft202012Validator.check_schema(function["parameters"])
        except jsonschema.SchemaError as exc:
            at = "/" + "/".join(str(p) for p in exc.path) if exc.path else "(root)"
            raise InvalidParameter(f"{where} is not a valid JSON Schema at {at}: {exc.message}", param=where) from None


def call_problem(tool_calls: list[dict[str, Any]], request: ToolRequest) -> str | None:
    """Why a call to a ``strict`` function in ``tool_calls`` breaks its schema; None when none does."""
    schemas = {t["function"]["name"]: t["function"].get("parameters") for t in request.tools}
    for i, call in enumerate(tool_calls):
        name = call["function"]["name"]
        if name not in request.strict:
            continue
        schema = schemas.get(name) or {"type": "object", "properties": {}, "additionalProperties": False}
        try:
            arguments = json.loads(call["function"]["arguments"])
        except ValueError as exc:
            return f"tool_calls[{i}] ({name}): the arguments are not JSON ({exc})"
        problem = schema_problem(arguments, schema)
        if problem is not None:
            return f"tool_calls[{i}] ({name}): {problem}"
    return None
