"""The JSON Schema subset miLLM serves, and the limits on a schema's size.

Constraint libraries compile some keywords without enforcing them, so the subset
is this server's own list: every keyword outside it is refused by name and JSON
pointer (RFC 6901) rather than silently ignored. The subset covers what pydantic
emits for common field types (dates, UUIDs, ``gt``/``lt``, sets, tuples, enums,
optionals, nested models, ``dict[str, X]``). Most keywords are enforced token by
token; ``CHECKED_AFTER`` ones are checked once the document is finished.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: Keywords the constraint enforces.
SUPPORTED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "prefixItems",
        "uniqueItems",
        "anyOf",
        "$ref",
        "$defs",
    }
)
#: Served but not enforceable by a grammar: checked (jsonschema) once the document is finished.
CHECKED_AFTER = frozenset({"uniqueItems"})
#: String formats the constraint enforces (llguidance's own list); any other is refused.
FORMATS = frozenset({"date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"})
#: Annotations: accepted and ignored.
ANNOTATIONS = frozenset({"title", "description", "default", "examples"})

UNSUPPORTED = "unsupported keyword"

MAX_SCHEMA_BYTES = 64 * 1024
MAX_DEPTH = 32
MAX_PROPERTIES = 256

_DEFS_PREFIX = "#/$defs/"


@dataclass(frozen=True)
class Problem:
    """One reason a schema cannot be served: the keyword (if any) and where it is."""

    pointer: str
    keyword: str | None
    reason: str

    def describe(self) -> str:
        where = self.pointer or "(root)"
        if self.keyword is None:
            return f"{where}: {self.reason}"
        return f"{self.keyword} at {where}" + ("" if self.reason == UNSUPPORTED else f" ({self.reason})")


def pointer_token(key: str) -> str:
    """An RFC 6901 reference token (``~`` → ``~0``, ``/`` → ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")


def schema_size(schema: Any) -> int:
    """Bytes of the schema as compact UTF-8 JSON."""
    return len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def check_subset(schema: Any) -> list[Problem]:
    """Every reason ``schema`` falls outside the subset or its limits (empty: it is served)."""
    size = schema_size(schema)
    if size > MAX_SCHEMA_BYTES:
        return [Problem("", None, f"the schema is {size} bytes; the limit is {MAX_SCHEMA_BYTES}")]
    problems = list(_walk(schema, schema, "", 1))
    return problems or list(_ref_loops(schema))


def _walk(root: Any, node: Any, pointer: str, depth: int) -> Iterator[Problem]:
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        yield Problem(pointer, None, "a schema must be an object or a boolean")
        return
    if depth > MAX_DEPTH:
        yield Problem(pointer, None, f"schemas nest deeper than {MAX_DEPTH} levels")
        return
    for key, value in node.items():
        here = f"{pointer}/{pointer_token(key)}"
        if key in ANNOTATIONS:
            continue
        if key not in SUPPORTED:
            yield Problem(here, key, UNSUPPORTED)
        elif key == "format" and (not isinstance(value, str) or value not in FORMATS):
            yield Problem(here, key, f"format {value!r} cannot be enforced; served: {', '.join(sorted(FORMATS))}")
        elif key in ("properties", "$defs") and isinstance(value, dict):
            if key == "properties" and len(value) > MAX_PROPERTIES:
                yield Problem(here, None, f"{len(value)} properties; the limit is {MAX_PROPERTIES} per object")
            for name, sub in value.items():
                yield from _walk(root, sub, f"{here}/{pointer_token(name)}", depth + 1)
        elif key in ("items", "additionalProperties"):
            if isinstance(value, list):
                yield Problem(here, key, "the array form of items (tuple validation) is unsupported")
            else:
                yield from _walk(root, value, here, depth + 1)
        elif key in ("anyOf", "prefixItems") and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _walk(root, sub, f"{here}/{i}", depth + 1)
        elif key == "$ref":
            yield from _check_ref(root, value, here)


def _check_ref(root: Any, ref: Any, pointer: str) -> Iterator[Problem]:
    """Only local references into ``$defs`` are served (no remote or other local ones)."""
    if not isinstance(ref, str) or not ref.startswith(_DEFS_PREFIX):
        yield Problem(pointer, "$ref", "only local references into $defs are supported")
        return
    target: Any = root
    for token in ["$defs", *ref[len(_DEFS_PREFIX) :].split("/")]:
        token = token.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or token not in target:
            yield Problem(pointer, None, f"$ref {ref!r} does not resolve")
            return
        target = target[token]


def _resolve(root: Any, ref: str) -> Any:
    """The node a ``#/$defs/...`` reference names (None when it does not resolve)."""
    target: Any = root
    for token in ["$defs", *ref[len(_DEFS_PREFIX) :].split("/")]:
        token = token.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or token not in target:
            return None
        target = target[token]
    return target


def _all_refs(node: Any, pointer: str) -> Iterator[tuple[str, str]]:
    """Every local ``$defs`` reference in the schema, with the pointer of its ``$ref``, in document order."""
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{pointer}/{pointer_token(key)}"
            if key == "$ref" and isinstance(value, str) and value.startswith(_DEFS_PREFIX):
                yield value, here
            else:
                yield from _all_refs(value, here)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _all_refs(value, f"{pointer}/{i}")


def _unguarded_refs(node: Any, pointer: str) -> Iterator[tuple[str, str]]:
    """(ref, its pointer) reachable from ``node`` before any input is produced: its own ``$ref``
    and its ``anyOf`` members'. Refs under ``properties`` or ``items`` come after a ``{`` or ``[``."""
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_DEFS_PREFIX):
        yield ref, f"{pointer}/$ref"
    members = node.get("anyOf")
    if isinstance(members, list):
        for i, member in enumerate(members):
            yield from _unguarded_refs(member, f"{pointer}/anyOf/{i}")


def _ref_loops(root: Any) -> Iterator[Problem]:
    """A ``$ref`` whose target can produce no finite document without producing itself first
    (``{"$ref": "#/$defs/a"}`` inside ``a``, or ``a`` → ``b`` → ``a``): the constraint would accept
    nothing and every reply would fail, so it is refused before any generation.

    A target is productive when its own ``$ref`` (if any) is, and one of its ``anyOf`` members
    (if any) is; anything under ``properties`` or ``items`` comes after a ``{`` or ``[``, so counts
    as progress. A worklist finds the productive ones (each re-checked only when a reference it
    waits on turns productive).
    """
    uses = list(_all_refs(root, ""))
    targets = {ref: _resolve(root, ref) for ref, _ in uses}
    productive: set[str] = set()

    def produces(node: Any) -> bool:
        if not isinstance(node, dict):
            return node is not False
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_DEFS_PREFIX) and ref not in productive:
            return False
        members = node.get("anyOf")
        return not isinstance(members, list) or any(produces(m) for m in members)

    waiting: dict[str, list[str]] = {}  # ref -> the refs whose target waits on it
    for ref, target in targets.items():
        for needed, _ in _unguarded_refs(target, ""):
            waiting.setdefault(needed, []).append(ref)
    ready = [ref for ref, target in targets.items() if target is not None and produces(target)]
    productive.update(ready)
    while ready:  # each ref is re-checked only when one it waits on becomes productive
        for ref in waiting.get(ready.pop(), ()):
            if ref not in productive and targets[ref] is not None and produces(targets[ref]):
                productive.add(ref)
                ready.append(ref)
    for ref, pointer in uses:
        if ref not in productive and targets[ref] is not None:
            yield Problem(
                pointer,
                "$ref",
                f"{ref} cannot produce a finite document without reaching itself "
                "again first (a reference loop with nothing in between)",
            )
            return
