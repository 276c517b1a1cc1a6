"""The supported JSON Schema subset: what is served, what is refused by keyword and pointer."""

from __future__ import annotations

import pytest

from millm_host.api import InvalidParameter
from millm_structured_output.errors import ResponseFormatUnsupported
from millm_structured_output.response_format import parse_response_format
from millm_structured_output.schema_subset import MAX_DEPTH, MAX_PROPERTIES, check_subset


def fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


SERVED = {
    "type": "object",
    "title": "everything the subset has",
    "description": "annotations are accepted and ignored",
    "examples": [{}],
    "properties": {
        "kind": {"enum": ["a", "b"], "default": "a"},
        "fixed": {"const": 3},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "name": {"type": "string", "minLength": 1, "maxLength": 8, "pattern": "^[a-z]+$"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "maybe": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/point"}]},
        "flags": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "n": {"type": ["integer", "null"]},
        "step": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 9, "multipleOf": 3},
        "when": {"type": "string", "format": "date-time"},
        "ids": {"type": "array", "items": {"type": "string", "format": "uuid"}, "uniqueItems": True},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "maxItems": 2},
    },
    "required": ["kind"],
    "additionalProperties": False,
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}}}},
}


def test_the_whole_subset_is_served():
    assert check_subset(SERVED) == []
    parsed = parse_response_format(fmt(SERVED))
    assert parsed.kind == "json_schema" and parsed.name == "t"


def test_text_and_json_object():
    assert parse_response_format({"type": "text"}) is None
    assert parse_response_format(None) is None
    assert parse_response_format({"type": "json_object"}).schema == {"type": "object"}


@pytest.mark.parametrize(
    "keyword, value",
    [
        ("not", {}),
        ("allOf", [{}]),
        ("oneOf", [{}]),
        ("if", {}),
        ("then", {}),
        ("else", {}),
        ("patternProperties", {}),
        ("dependentRequired", {}),
        ("$schema", "https://json-schema.org/draft/2020-12/schema"),
        ("definitions", {}),
    ],
)
def test_each_unsupported_keyword_is_named_with_its_pointer(keyword, value):
    schema = {"type": "object", "properties": {"a/b": {"type": "integer", keyword: value}}}
    with pytest.raises(ResponseFormatUnsupported) as raised:
        parse_response_format(fmt(schema))
    error = raised.value
    assert error.code == "response_format_unsupported" and error.status == 400 and error.param == "response_format"
    assert f"{keyword} at /properties/a~1b/{keyword}" in error.message
    assert error.extra["unsupported"] == [
        {"keyword": keyword, "pointer": f"/properties/a~1b/{keyword}", "reason": "unsupported keyword"}
    ]


def test_every_problem_is_reported_at_once():
    schema = {
        "type": "array",
        "contains": {"type": "string", "format": "binary"},
        "items": [{"type": "string", "format": "email"}],
        "anyOf": [{"not": {}}],
    }
    problems = {(p.keyword, p.pointer) for p in check_subset(schema)}
    assert problems == {("contains", "/contains"), ("items", "/items"), ("not", "/anyOf/0/not")}


@pytest.mark.parametrize(
    "ref", ["https://example.com/s.json", "#/definitions/x", "#", "#/properties/a", "#/$defs/missing"]
)
def test_only_local_refs_into_defs(ref):
    schema = {"type": "object", "properties": {"a": {"$ref": ref}}, "$defs": {"x": {}}}
    with pytest.raises(ResponseFormatUnsupported) as raised:
        parse_response_format(fmt(schema))
    assert "/properties/a/$ref" in raised.value.message


def test_size_depth_and_property_limits():
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(MAX_PROPERTIES + 1)}}
    assert check_subset({"type": "object", "properties": dict(list(wide["properties"].items())[:MAX_PROPERTIES])}) == []
    with pytest.raises(ResponseFormatUnsupported, match="257 properties; the limit is 256"):
        parse_response_format(fmt(wide))

    def nested(depth):
        schema = {"type": "integer"}
        for _ in range(depth - 1):
            schema = {"type": "array", "items": schema}
        return schema

    assert check_subset(nested(MAX_DEPTH)) == []
    with pytest.raises(ResponseFormatUnsupported, match="deeper than 32"):
        parse_response_format(fmt(nested(MAX_DEPTH + 1)))

    big = {"type": "string", "description": "x" * (64 * 1024)}
    with pytest.raises(ResponseFormatUnsupported, match="the limit is 65536"):
        parse_response_format(fmt(big))


@pytest.mark.parametrize(
    "value, param",
    [
        ("json", "response_format"),
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "has space", "schema": {}}},
            "response_format.json_schema.name",
        ),
        ({"type": "json_schema", "json_schema": {"name": "n"}}, "response_format.json_schema.schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "n", "strict": "yes", "schema": {}}},
            "response_format.json_schema.strict",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "strnig"}}},
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "n", "schema": {"minItems": -1}}},
            "response_format.json_schema.schema",
        ),
    ],
)
def test_malformed_values_are_invalid_parameters(value, param):
    with pytest.raises(InvalidParameter) as raised:
        parse_response_format(value)
    assert raised.value.param == param


@pytest.mark.parametrize(
    "schema, pointer",
    [
        ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "/$defs/a/$ref"),
        (
            {
                "type": "object",
                "properties": {"p": {"$ref": "#/$defs/a"}},
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
            },
            "/properties/p/$ref",
        ),
    ],
    ids=["itself", "through-another-and-anyOf"],
)
def test_a_ref_that_reaches_itself_before_any_input_is_refused(schema, pointer):
    """Such a schema describes no finite document: the constraint accepted nothing and every reply was a 500."""
    with pytest.raises(ResponseFormatUnsupported) as raised:
        parse_response_format(fmt(schema))
    assert raised.value.status == 400 and f"$ref at {pointer}" in raised.value.message
    assert raised.value.extra["unsupported"][0]["pointer"] == pointer


@pytest.mark.parametrize(
    "schema",
    [
        {
            "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
            "$ref": "#/$defs/node",
        },
        {
            "$defs": {"a": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}},
            "$ref": "#/$defs/a",
        },
        {"$defs": {"list": {"type": "array", "items": {"$ref": "#/$defs/list"}}}, "$ref": "#/$defs/list"},
    ],
    ids=["recursive-object", "loop-with-a-way-out", "nested-arrays"],
)
def test_recursion_through_input_is_served(schema):
    assert check_subset(schema) == []
    parse_response_format(fmt(schema))
