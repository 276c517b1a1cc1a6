"""Extract the OpenAI response schemas millm is checked against.

OpenAI's published spec (../shared/reference/openai-openapi.json, 3.4 MB) is
outside the repository; this keeps only the component schemas the tests use,
with everything they reference, and rewrites OpenAPI 3.0's ``nullable: true``
as ``anyOf [..., null]`` so jsonschema (2020-12) reads it.

    python tools/extract_openai_schemas.py ../shared/reference/openai-openapi.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOTS = (
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "CreateEmbeddingResponse",
    "ListModelsResponse",
    "Model",
    "ErrorResponse",
)
TARGET = Path(__file__).resolve().parent.parent / "millm_host" / "testing" / "openai_schemas.json"
#: The Responses API's schemas, a file of their own (they reference some 300 others).
RESPONSES_ROOTS = ("Response", "ResponseStreamEvent")
RESPONSES_TARGET = TARGET.with_name("openai_responses_schemas.json")


def denullable(node):
    if isinstance(node, list):
        return [denullable(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: denullable(v) for k, v in node.items()}
    if node.pop("nullable", False):
        if "$ref" in node or "allOf" in node or "anyOf" in node or "oneOf" in node or "type" in node:
            inner = {k: v for k, v in node.items() if k not in ("description", "title", "default")}
            outer = {k: v for k, v in node.items() if k in ("description", "title", "default")}
            node = {**outer, "anyOf": [inner, {"type": "null"}]}
    return node


def refs(node, found):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            found.add(ref.rsplit("/", 1)[1])
        for v in node.values():
            refs(v, found)
    elif isinstance(node, list):
        for v in node:
            refs(v, found)


def main(source: str) -> None:
    schemas = json.loads(Path(source).read_text())["components"]["schemas"]
    extract(schemas, ROOTS, TARGET)
    extract(schemas, RESPONSES_ROOTS, RESPONSES_TARGET)


def extract(schemas: dict, roots: tuple[str, ...], target: Path) -> None:
    keep, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        found: set[str] = set()
        refs(schemas[name], found)
        todo.extend(found - keep)
    out = {"$defs": {name: denullable(schemas[name]) for name in sorted(keep)}}
    text = json.dumps(out, indent=1, sort_keys=True).replace("#/components/schemas/", "#/$defs/")
    target.write_text(text + "\n")
    print(f"wrote {len(keep)} schemas to {target}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/reference/openai-openapi.json")
