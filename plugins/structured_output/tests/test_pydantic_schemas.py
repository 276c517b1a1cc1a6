"""What pydantic emits for common types is served: the subset, the grammar (closed objects), the validation."""

from __future__ import annotations

import json

import llguidance
import llguidance.hf
import pydantic
import pytest

from millm_structured_output.constraint import ConstraintCompiler
from millm_structured_output.errors import ResponseFormatUnsupported
from millm_structured_output.grammar_schema import grammar_schema
from millm_structured_output.response_format import parse_response_format
from millm_structured_output.schema_subset import check_subset
from millm_structured_output.validation import document_problem

from .pydantic_models import BOOKING, Booking, Slot, as_model_writes


def fmt(schema):
    return parse_response_format({"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_model_dir)
    return hf, llguidance.hf.from_tokenizer(hf)


def accepts(tokenizer, schema, text: str) -> bool:
    """Whether the constraint compiled for ``schema`` lets a model write exactly ``text``."""
    hf, ll = tokenizer
    matcher = llguidance.LLMatcher(ll, ConstraintCompiler().grammar(fmt(schema)))
    ids = hf(text, add_special_tokens=False)["input_ids"]
    return all(matcher.consume_token(i) for i in ids) and matcher.is_accepting()


@pytest.mark.parametrize("model", [Booking, Slot])
def test_pydantic_schemas_are_served(model):
    schema = model.model_json_schema()
    assert check_subset(schema) == []
    ConstraintCompiler().grammar(fmt(schema))


def test_the_grammar_accepts_a_valid_instance_as_written(tokenizer):
    assert accepts(tokenizer, Booking.model_json_schema(), as_model_writes(BOOKING))


@pytest.mark.parametrize(
    "field, value",
    [
        ("day", "2025-02-30"),  # format: date (no 30 February)
        ("starts", "25:00:00Z"),  # format: time
        ("booked_at", "1 March 2025, noon"),  # format: date-time
        ("ref", "not-a-uuid"),  # format: uuid
        ("status", "cancelled"),  # Literal (enum)
        ("kind", "party"),  # Literal (const)
        ("room", "medium"),  # Enum ($ref into $defs)
        ("note", 3),  # Optional[Literal] (anyOf with null)
        ("counts", {"chairs": "eight"}),  # dict[str, int] (additionalProperties schema)
        ("organiser", {"role": "host", "age": 0}),  # nested model; gt=0 (exclusiveMinimum)
        ("organiser", {"role": "host", "age": 120}),  # lt=120 (exclusiveMaximum)
        ("tags", [1, 2, 3, 4]),  # set max_length (maxItems)
    ],
)
def test_the_grammar_enforces_each_type(tokenizer, field, value):
    document = {**json.loads(as_model_writes(BOOKING)), field: value}
    with pytest.raises(pydantic.ValidationError):
        Booking.model_validate(document)
    assert not accepts(tokenizer, Booking.model_json_schema(), json.dumps(document, separators=(", ", ": ")))


def test_no_padding_keys_objects_that_list_properties_are_closed(tokenizer):
    schema = Booking.model_json_schema()
    padded = json.loads(as_model_writes(BOOKING))
    padded["extra"] = 1
    assert not accepts(tokenizer, schema, json.dumps(padded, separators=(", ", ": ")))
    nested = json.loads(as_model_writes(BOOKING))
    nested["organiser"]["extra"] = 1
    assert not accepts(tokenizer, schema, json.dumps(nested, separators=(", ", ": ")))
    # a dict's keys are free; a schema that says additionalProperties keeps it
    assert accepts(tokenizer, {"type": "object", "additionalProperties": {"type": "integer"}}, '{"any": 1}')
    assert accepts(tokenizer, {"type": "object", "properties": {"a": {}}, "additionalProperties": True}, '{"b": 1}')


def test_grammar_schema_closes_only_objects_listing_their_keys():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}},
        "$defs": {
            "listed": {"properties": {"x": {}}, "required": ["x"]},
            "requires_unlisted": {"properties": {"x": {}}, "required": ["y"]},
            "map": {"type": "object", "additionalProperties": {"type": "integer"}},
            "set": {"type": "array", "items": {"properties": {"k": {}}}, "uniqueItems": True},
        },
        "anyOf": [{"properties": {"c": {}}}],
    }
    closed = grammar_schema(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["$defs"]["listed"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["$defs"]["requires_unlisted"]  # closing it would accept nothing
    assert closed["$defs"]["map"]["additionalProperties"] == {"type": "integer"}
    assert "uniqueItems" not in closed["$defs"]["set"]  # checked after generation instead
    assert closed["$defs"]["set"]["items"]["additionalProperties"] is False
    assert closed["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the schema as sent (validated against) is untouched


def test_unique_items_are_checked_after_generation():
    document = json.loads(as_model_writes(BOOKING))
    document["tags"] = [1, 1]
    problem = document_problem(json.dumps(document), fmt(Booking.model_json_schema()))
    assert problem is not None and "$.tags" in problem and "non-unique" in problem


def test_validation_checks_formats_too():
    problem = document_problem('"2025-02-30"', fmt({"type": "string", "format": "date"}))
    assert problem is not None and "date" in problem
    assert document_problem('"2025-02-28"', fmt({"type": "string", "format": "date"})) is None


@pytest.mark.parametrize("name", ["email", "uuid", "date", "time", "date-time", "duration", "ipv4", "uri"])
def test_enforced_formats_are_served(name):
    ConstraintCompiler().grammar(fmt({"type": "string", "format": name}))


def test_a_format_the_constraint_cannot_enforce_is_refused_by_pointer():
    class Blob(pydantic.BaseModel):
        data: bytes  # pydantic: {"type": "string", "format": "binary"}

    with pytest.raises(ResponseFormatUnsupported) as raised:
        fmt(Blob.model_json_schema())
    assert "format at /properties/data/format (format 'binary' cannot be enforced" in raised.value.message
    assert raised.value.extra["unsupported"][0]["pointer"] == "/properties/data/format"


def test_tuples_are_served(tokenizer):
    class Pair(pydantic.BaseModel):
        pair: tuple[int, str]

    schema = Pair.model_json_schema()
    assert accepts(tokenizer, schema, '{"pair": [1, "a"]}')
    assert not accepts(tokenizer, schema, '{"pair": [1, 2]}')


@pytest.mark.parametrize(
    ("value", "valid"), [("14:30:00", True), ("14:30:00Z", True), ("14:30:00.5+02:00", True), ("25:00:00", False)]
)
def test_a_time_without_an_offset_validates_as_the_grammar_lets_it_through(value, valid):
    """pydantic's ``time`` is ``format: time``; llguidance lets ``14:30:00`` through, so validation must too."""
    fmt = parse_response_format({"type": "json_schema", "json_schema": {"name": "t", "schema": TIME_SCHEMA}})
    problem = document_problem(json.dumps({"at": value}), fmt)
    assert (problem is None) == valid, problem


TIME_SCHEMA = {"type": "object", "properties": {"at": {"type": "string", "format": "time"}}, "required": ["at"]}
