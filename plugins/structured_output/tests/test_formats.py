"""The three call formats and the output filter, on text alone."""

from __future__ import annotations

import json

import pytest

from millm_structured_output.tools.filter import ToolCallFilter
from millm_structured_output.tools.formats import HERMES, LLAMA3_JSON, PYTHONIC, ParsedCall
from millm_structured_output.tools.template import template_traits

from .family import LFM2_TEMPLATE, LLAMA31_TEMPLATE, QWEN25_TEMPLATE, UNKNOWN_FORMAT_TEMPLATE

NAMES = frozenset({"get_weather", "get_time"})
PARIS = ParsedCall("get_weather", {"city": "Paris"})


def test_formats_are_read_off_the_templates():
    assert template_traits(QWEN25_TEMPLATE).call_format is HERMES
    assert template_traits(LLAMA31_TEMPLATE).call_format is LLAMA3_JSON
    assert template_traits(LFM2_TEMPLATE).call_format is PYTHONIC
    unknown = template_traits(UNKNOWN_FORMAT_TEMPLATE)
    assert unknown.takes_tools and unknown.call_format is None
    assert template_traits(QWEN25_TEMPLATE).renders_tool_calls
    assert not template_traits(LFM2_TEMPLATE).renders_tool_calls
    smollm2 = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    assert not template_traits(smollm2).takes_tools
    assert not template_traits("{{ 'I have no tools' }}").takes_tools


@pytest.mark.parametrize(
    "text, calls, trailing",
    [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', [PARIS], ""),
        ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call> ok', [PARIS], " ok"),
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>',
            [PARIS, ParsedCall("get_time", {"city": "Oslo"})],
            "",
        ),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', [PARIS], ""),  # EOS before the close
    ],
)
def test_hermes_parses(text, calls, trailing):
    reply = HERMES.parse(text)
    assert reply.calls == calls and reply.trailing == trailing


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        "<tool_call>\nnot json\n</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
        "no call at all",
    ],
)
def test_hermes_malformed_is_none(text):
    assert HERMES.parse(text) is None


@pytest.mark.parametrize(
    "text, calls, trailing",
    [
        ("<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>", [PARIS], ""),
        (
            '<|tool_call_start|>[get_weather(city="Paris"), get_time(city="Oslo")]<|tool_call_end|>Checking.',
            [PARIS, ParsedCall("get_time", {"city": "Oslo"})],
            "Checking.",
        ),
        ("[get_weather(city='Paris')]", [PARIS], ""),  # the markers as special tokens, left out of the text
        (
            "<|tool_call_start|>[f(a=true, b=null, c=[1, {'k': False}], d=-2.5)]<|tool_call_end|>",
            [ParsedCall("f", {"a": True, "b": None, "c": [1, {"k": False}], "d": -2.5})],
            "",
        ),
        ('<|tool_call_start|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|tool_call_end|>', [PARIS], ""),
        # LFM2's tokenizer makes the markers special tokens, which decoded text leaves out:
        ("<|tool_call_start|>[get_weather(city='Paris')]Checking [now].", [PARIS], "Checking [now]."),
        ("[get_weather(city='Pa]ris')] ok", [ParsedCall("get_weather", {"city": "Pa]ris"})], " ok"),
        ("get_weather(city='Paris')", [PARIS], ""),
    ],
)
def test_pythonic_parses(text, calls, trailing):
    reply = PYTHONIC.parse(text)
    assert reply.calls == calls and reply.trailing == trailing


@pytest.mark.parametrize(
    "text",
    [
        "<|tool_call_start|>[get_weather('Paris')]<|tool_call_end|>",  # positional: no parameter name
        "<|tool_call_start|>[get_weather(city=open('x'))]<|tool_call_end|>",  # not a literal
        "<|tool_call_start|>[os.system(cmd='x')]<|tool_call_end|>",
        "[1, 2, 3]",
        "<|tool_call_start|>[get_weather(city='Par",
    ],
)
def test_pythonic_malformed_is_none(text):
    assert PYTHONIC.parse(text) is None


def test_llama3_parses_the_whole_reply():
    assert LLAMA3_JSON.parse(' {"name": "get_weather", "parameters": {"city": "Paris"}} ').calls == [PARIS]
    two = (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {"city": "Oslo"}}'
    )
    assert [c.name for c in LLAMA3_JSON.parse(two).calls] == ["get_weather", "get_time"]
    assert LLAMA3_JSON.parse('{"name": "get_weather", "parameters": {"city": "Paris"}} and more') is None
    assert LLAMA3_JSON.parse('{"city": "Paris"}') is None
    assert LLAMA3_JSON.parse("The weather is fine") is None


@pytest.mark.parametrize("fmt", [HERMES, PYTHONIC, LLAMA3_JSON])
def test_render_parses_back(fmt):
    calls = [PARIS, ParsedCall("get_time", {"city": "Oslo", "exact": True, "n": None})]
    assert fmt.parse(fmt.render(calls)).calls == calls


def test_pythonic_strings_written_as_json_mean_what_json_says():
    """The grammar writes each keyword's value as JSON: its escapes are read as JSON's, not Python's."""
    (call,) = PYTHONIC.parse('[f(a="x\\/y", b="\\ud83d\\ude00", c=\'q\', d="p" "q")]').calls
    assert call.arguments == {"a": "x/y", "b": "\U0001f600", "c": "q", "d": "pq"}


def feed_all(flt: ToolCallFilter, pieces: list[str]) -> str:
    return "".join(flt.feed(p) for p in pieces)


def test_filter_streams_text_before_a_call_and_holds_the_call():
    flt = ToolCallFilter(HERMES, NAMES, parallel=True)
    pieces = [
        "Let me ",
        "check.",
        "<tool",
        '_call>\n{"name": "get_weather", ',
        '"arguments": {"city": "Paris"}}',
        "\n</tool_call>",
    ]
    assert feed_all(flt, pieces) == "Let me check."
    result = flt.finish("stop")
    assert result.finish_reason == "tool_calls" and result.text == ""
    call = result.message_extras["tool_calls"][0]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}
    assert "content" not in result.message_extras  # the text before the call stays content
    assert accumulate(flt.take_deltas()) == [call]  # unconstrained: sent once its arguments are whole


def accumulate(deltas: list[dict]) -> list[dict]:
    """Stream deltas put together as the openai SDK does: the first of an index opens it, the rest add arguments."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        for part in delta["tool_calls"]:
            if part["index"] not in calls:
                assert set(part) == {"index", "id", "type", "function"} and part["function"]["arguments"] == ""
                calls[part["index"]] = {"id": part["id"], "type": part["type"], "function": dict(part["function"])}
            else:
                assert set(part) == {"index", "function"} and set(part["function"]) == {"arguments"}
                calls[part["index"]]["function"]["arguments"] += part["function"]["arguments"]
    return [calls[i] for i in sorted(calls)]


def test_a_constrained_call_streams_its_name_then_its_arguments_as_written():
    flt = ToolCallFilter(HERMES, NAMES, parallel=True, live=True)
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris"}}\n</tool_call>'
    reply = weather + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    deltas = []
    for i in range(0, len(reply), 3):  # a few characters at a time, as tokens come
        assert flt.feed(reply[i : i + 3]) == ""
        deltas.append(flt.take_deltas())
    assert sum(1 for d in deltas if d) > 4  # the arguments arrive piece by piece, not in one delta at the end
    first = next(d for d in deltas if d)[0]["tool_calls"][0]
    assert first["function"] == {"name": "get_weather", "arguments": ""}  # the name before any argument
    result = flt.finish("stop")
    streamed = accumulate([*(d for batch in deltas for d in batch), *flt.take_deltas()])
    assert result.finish_reason == "tool_calls" and result.message_extras["tool_calls"] == streamed
    assert [json.loads(c["function"]["arguments"]) for c in streamed] == [{"city": "Pa}ris"}, {}]


@pytest.mark.parametrize(
    ("fmt", "reply", "kept"),
    [
        (
            HERMES,
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "argum',
            1,
        ),
        (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', 0),
        (
            LLAMA3_JSON,
            '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {"ci',
            1,
        ),
        (PYTHONIC, "<|tool_call_start|>[get_weather(city='Paris'), get_time(city='Os", 1),
        (PYTHONIC, "<|tool_call_start|>[get_weather(ci", 0),
    ],
)
@pytest.mark.parametrize("live", [False, True])
def test_a_call_cut_by_max_tokens_is_dropped_and_the_complete_ones_kept(fmt, reply, kept, live):
    flt = ToolCallFilter(fmt, NAMES, parallel=True, live=live)
    assert flt.feed(reply) == ""
    result = flt.finish("length")
    assert result.text == ""  # never the call syntax as content
    calls = result.message_extras.get("tool_calls") or []
    assert [c["function"]["name"] for c in calls] == ["get_weather"][:kept]
    if kept:
        assert result.finish_reason == "length" and result.message_extras["content"] is None
        assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_filter_releases_a_partial_marker_that_turns_out_not_to_be_one():
    flt = ToolCallFilter(HERMES, NAMES, parallel=True)
    assert flt.feed("a <tool") == "a "
    assert flt.feed("box> b") == "<toolbox> b"
    assert flt.finish("stop").text == ""


def test_filter_unknown_function_or_malformed_stays_content():
    flt = ToolCallFilter(HERMES, NAMES, parallel=True)
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert flt.feed(text) == ""
    result = flt.finish("stop")
    assert result.text == text and result.finish_reason is None and not result.message_extras

    flt = ToolCallFilter(LLAMA3_JSON, NAMES, parallel=True)
    assert flt.feed('{"answer": 42}') == ""
    assert flt.finish("length").text == '{"answer": 42}'


def test_filter_only_call_means_null_content_and_parallel_false_keeps_one():
    flt = ToolCallFilter(PYTHONIC, NAMES, parallel=False)
    flt.feed("<|tool_call_start|>[get_weather(city='Paris'), get_time(city='Oslo')]<|tool_call_end|>")
    result = flt.finish("stop")
    assert result.message_extras["content"] is None
    assert [c["function"]["name"] for c in result.message_extras["tool_calls"]] == ["get_weather"]


def test_llama_filter_releases_plain_replies_at_once():
    flt = ToolCallFilter(LLAMA3_JSON, NAMES, parallel=True)
    assert flt.feed("  ") == ""
    assert flt.feed("Hello {") == "  Hello {"
    assert flt.finish("stop").text == ""
