"""The grammar a family's tool calls are held to (``tools/grammar.py``, ``tools/kwargs.py``), and ``strict``.

Each grammar is compiled with llguidance for SmolLM2's tokenizer (the tiny
models'), and texts are fed to it token by token: what it accepts is what a
model can write. Markers that are special tokens are checked on a copy of the
tokenizer that makes them so, as LFM2's does.
"""

from __future__ import annotations

import functools

import llguidance
import llguidance.hf
import pytest
import transformers

from millm_host.api import FieldNotHonoured, InvalidParameter
from millm_structured_output.tools.formats import HERMES, LLAMA3_JSON, PYTHONIC
from millm_structured_output.tools.grammar import tools_format
from millm_structured_output.tools.request import parse_tool_request
from millm_structured_output.tools.strict import call_problem, check_strict

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
PING = {"type": "function", "function": {"name": "ping"}}
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HERMES_BAD = '<tool_call>\n{"name": "get_weather", "arguments": {"city": 5}}\n</tool_call>'
LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
LFM2_CALL = '<|tool_call_start|>[get_weather(city="Paris", days=3)]<|tool_call_end|>'


@functools.cache
def tokenizer(special_markers: bool = False):
    from millm_host.testing.tiny_models import smollm2_tokenizer_dir

    hf = transformers.AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    if special_markers:
        markers = ["<|tool_call_start|>", "<|tool_call_end|>", "<tool_call>", "</tool_call>"]
        hf.add_special_tokens({"additional_special_tokens": markers})
    return hf, llguidance.hf.from_tokenizer(hf, n_vocab=len(hf))


def grammar(fmt, *, special_markers: bool = False, tools=(WEATHER, PING), **body):
    hf, _ = tokenizer(special_markers)
    lark = tools_format(parse_tool_request({"tools": list(tools), **body}), fmt, None, hf).lark
    compiled = llguidance.LLMatcher.grammar_from_lark(lark)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled)
    assert not is_error, messages
    return compiled


def accepts(compiled, text: str | list[int], *, special_markers: bool = False) -> bool:
    hf, ll = tokenizer(special_markers)
    matcher = llguidance.LLMatcher(ll, compiled)
    ids = text if isinstance(text, list) else hf.encode(text, add_special_tokens=False, split_special_tokens=True)
    return bool(matcher.consume_tokens(ids) and matcher.is_accepting())


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        (
            HERMES,
            ["Sunny.", "", "Let me look.\n" + HERMES_CALL, HERMES_CALL + "\n" + HERMES_CALL.replace("Paris", "Oslo")],
            [HERMES_BAD, "x <tool_call> no", HERMES_CALL.replace("get_weather", "delete_all"), HERMES_CALL + " more"],
        ),
        (
            LLAMA3_JSON,
            ["Sunny.", "", LLAMA_CALL, LLAMA_CALL + '; {"name": "ping", "parameters": {}}'],
            [' {"city": "Paris"}', LLAMA_CALL.replace("Paris", "Parisienne"), LLAMA_CALL + " and more"],
        ),
        (
            PYTHONIC,
            ["Sunny.", "", LFM2_CALL, LFM2_CALL.replace(")]", "), ping()]") + "Checking the weather."],
            [
                " [get_weather(city=5)]",  # text that opens with "[" would be read as calls
                "Sure <|tool_call_start|>",
                LFM2_CALL.replace("city=", "town="),
                LFM2_CALL.replace('city="Paris", days=3', 'days=3, city="Paris"'),  # the schema's order
                "<|tool_call_start|>[get_weather(days=3)]<|tool_call_end|>",  # city is required
            ],
        ),
    ],
)
def test_auto_is_text_that_reads_as_no_call_or_calls_held_to_the_schema(fmt, good, bad):
    compiled = grammar(fmt)
    assert [text for text in good if not accepts(compiled, text)] == []
    assert [text for text in bad if accepts(compiled, text)] == []


@pytest.mark.parametrize(("fmt", "call"), [(HERMES, HERMES_CALL), (LLAMA3_JSON, LLAMA_CALL), (PYTHONIC, LFM2_CALL)])
def test_required_and_a_named_function_allow_calls_only(fmt, call):
    required = grammar(fmt, tool_choice="required")
    assert accepts(required, call) and not accepts(required, "Sunny.") and not accepts(required, "")
    named = grammar(fmt, tool_choice={"type": "function", "function": {"name": "ping"}})
    assert not accepts(named, call)


def test_lfm2_keeps_its_json_variant_for_parameters_keyword_arguments_cannot_hold():
    loose = {"type": "function", "function": {"name": "tag", "parameters": {"type": "object"}}}  # any keys
    compiled = grammar(PYTHONIC, tools=(loose,), tool_choice="required")
    assert accepts(compiled, '<|tool_call_start|>[{"name": "tag", "arguments": {"any-key": 1}}]<|tool_call_end|>')
    assert PYTHONIC.parse('[{"name": "tag", "arguments": {"any-key": 1}}]').calls[0].arguments == {"any-key": 1}


def test_special_markers_are_matched_as_their_tokens():
    hf, _ = tokenizer(True)
    start, end = hf.convert_tokens_to_ids(["<|tool_call_start|>", "<|tool_call_end|>"])
    body = hf.encode('[get_weather(city="Paris")]', add_special_tokens=False)
    compiled = grammar(PYTHONIC, special_markers=True)
    assert accepts(compiled, [start, *body, end], special_markers=True)
    assert not accepts(
        compiled, '<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>', special_markers=True
    )
    open_call, close_call = hf.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    inner = hf.encode('\n{"name": "ping", "arguments": {}}\n', add_special_tokens=False)
    hermes = grammar(HERMES, special_markers=True)
    text_then_call = [*hf.encode("Hi ", add_special_tokens=False), open_call, *inner, close_call]
    assert accepts(hermes, text_then_call, special_markers=True)


STRICT_PARAMETERS = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    "required": ["tags"],
    "additionalProperties": False,
}


def strict_request(parameters):
    tool = {"type": "function", "function": {"name": "tag", "parameters": parameters, "strict": True}}
    return parse_tool_request({"tools": [WEATHER, tool]})


def test_strict_refuses_what_the_constraint_cannot_enforce():
    check_strict(strict_request(STRICT_PARAMETERS))  # served
    with pytest.raises(FieldNotHonoured) as refused:
        check_strict(strict_request({**STRICT_PARAMETERS, "properties": {"tags": {"not": {"type": "null"}}}}))
    assert refused.value.param == "tools[1].function.parameters"
    assert refused.value.extra["unsupported"] == [
        {"keyword": "not", "pointer": "/properties/tags/not", "reason": "unsupported keyword"}
    ]
    with pytest.raises(InvalidParameter) as invalid:
        check_strict(strict_request({"type": "object", "properties": {"tags": {"type": "texte"}}}))
    assert invalid.value.param == "tools[1].function.parameters"
    with pytest.raises(InvalidParameter) as wrong_type:
        parse_tool_request({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]})
    assert wrong_type.value.param == "tools[0].function.strict"
    loose = parse_tool_request({"tools": [{**WEATHER, "function": {**WEATHER["function"], "parameters": {"not": {}}}}]})
    check_strict(loose)  # without strict the schema is a hint: what cannot be enforced is ignored


def test_a_strict_call_is_checked_against_the_schema_as_sent():
    request = strict_request(STRICT_PARAMETERS)

    def call(name, arguments):
        return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}

    assert call_problem([call("tag", '{"tags": ["a", "b"]}')], request) is None
    assert "non-unique" in call_problem([call("tag", '{"tags": ["a", "a"]}')], request)
    assert call_problem([call("get_weather", '{"city": 5}')], request) is None  # not strict: not checked here
