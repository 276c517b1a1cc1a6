"""The logits processor on SmolLM2's real tokenizer, checked against jsonschema independently."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from millm_structured_output.constraint import ConstraintCompiler, JsonConstraint
from millm_structured_output.response_format import parse_response_format

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["humor", "not_humor"]},
        "score": {"type": "integer", "minimum": 3, "maximum": 7},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "word": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 5},
        "tags": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3},
    },
    "required": ["label", "score", "ratio", "word", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """A real transformers engine on the tiny model (SmolLM2's tokenizer)."""
    from millm_engine_transformers.engine import TransformersEngine
    from millm_engine_transformers.spec import describe
    from millm_host.api import Settings

    loaded = TransformersEngine.load(describe(str(tiny_model_dir)), Settings(), lambda message: None)
    yield loaded
    loaded.close()


def run(engine, fmt, seed: int, max_tokens: int = 120) -> tuple[str, bool]:
    """Sample from random logits under the constraint; (text, ended with EOS)."""
    compiler = ConstraintCompiler()
    process = JsonConstraint(compiler.matcher(engine, fmt), engine.info.vocab_size, sorted(engine.info.eos_token_ids))
    generator = torch.Generator().manual_seed(seed)
    generated: list[int] = []
    eos = engine.info.eos_token_ids
    for _ in range(max_tokens):
        logits = process(generated, torch.randn(engine.info.vocab_size, generator=generator) * 3)
        token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
        if token in eos:
            return engine.tokenizer.decode(generated), True
        generated.append(token)
    return engine.tokenizer.decode(generated), False


@pytest.mark.parametrize("seed", range(4))
def test_sampled_documents_validate(engine, seed):
    fmt = parse_response_format({"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}})
    text, ended = run(engine, fmt, seed)
    assert ended, text
    jsonschema.validate(json.loads(text), SCHEMA)


def test_eos_only_once_the_document_is_complete(engine):
    fmt = parse_response_format({"type": "json_object"})
    compiler = ConstraintCompiler()
    process = JsonConstraint(compiler.matcher(engine, fmt), engine.info.vocab_size, [engine.tokenizer.eos_token_id])
    eos = engine.tokenizer.eos_token_id
    ids = engine.tokenizer('{"a": [1, 2]}', add_special_tokens=False)["input_ids"]
    logits = torch.zeros(engine.info.vocab_size)
    for step in range(len(ids)):
        allowed = process(ids[:step], logits) > float("-inf")
        assert bool(allowed[ids[step]]), engine.tokenizer.decode(ids[: step + 1])
        assert not bool(allowed[eos])
    allowed = process(ids, logits) > float("-inf")
    assert bool(allowed[eos])


def test_a_failed_matcher_leaves_only_eos(engine):
    fmt = parse_response_format({"type": "json_object"})
    process = JsonConstraint(ConstraintCompiler().matcher(engine, fmt), engine.info.vocab_size, [2])
    not_json = engine.tokenizer("hello", add_special_tokens=False)["input_ids"]
    allowed = process(not_json, torch.zeros(engine.info.vocab_size)) > float("-inf")
    assert allowed.nonzero().flatten().tolist() == [2]


def test_matchers_are_cached_per_model_and_copied_per_sequence(engine):
    compiler = ConstraintCompiler()
    fmt = parse_response_format({"type": "json_object"})
    first, second = compiler.matcher(engine, fmt), compiler.matcher(engine, fmt)
    assert first is not second
    first.consume_token(engine.tokenizer("{", add_special_tokens=False)["input_ids"][0])
    assert second.is_accepting() is False and not second.is_error()
    assert len(compiler._per_engine[engine][1]) == 1
    assert compiler.grammar(fmt) is compiler.grammar(fmt)
