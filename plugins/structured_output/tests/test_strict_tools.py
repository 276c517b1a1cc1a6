"""``strict`` function tools: every call a model makes is held to its function's ``parameters``, on every path.

Through the openai SDK against ``family_server`` (tiny random models carrying each
family's template: Hermes, Llama 3's JSON, LFM2's and, for SmolLM2's template,
the generic format). Random weights write junk, so only the grammar makes a reply
a valid call: each call here is validated against its function's schema, for
several seeds, streamed and not, on chat completions and ``/v1/responses``.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from millm_host.testing import assert_error
from millm_host.testing.sse import sse_events

from .family import scripted
from .test_generic_tools import QUESTION, SHORT_SCHEMAS, SHORT_TIME, SHORT_WEATHER

FAMILIES = ["tiny-qwen25", "tiny-llama31", "tiny-lfm2", "tiny-smollm2"]
STRICT_TOOLS = [
    {"type": "function", "function": {**t["function"], "strict": True}} for t in (SHORT_WEATHER, SHORT_TIME)
]
NAMED = {"type": "function", "function": {"name": "get_time"}}
#: Call syntax that must never reach content (any family's).
CALL_MARKERS = ("<tool_call>", "<|tool_call_start|>", '{"name"', '"tool_call')


@pytest.fixture(scope="module")
def family(family_server):
    return family_server.openai()


def create(client, model, **body):
    body = {
        "messages": QUESTION,
        "tools": STRICT_TOOLS,
        "max_tokens": 150,  # tiny-llama31's prompt is 333 tokens of its 512
        "temperature": 1.0,
        **body,
    }
    return client.chat.completions.with_raw_response.create(model=model, **body)


def assert_calls_valid(calls, names=("get_weather", "get_time")) -> None:
    assert calls
    for call in calls:
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SHORT_SCHEMAS[call.function.name])


@pytest.mark.parametrize("model", FAMILIES)
def test_every_call_is_valid_forced_or_not_streamed_or_not(family, model):
    for seed, tool_choice in [(0, "required"), (1, "required"), (2, NAMED)]:
        names = ("get_time",) if tool_choice is NAMED else ("get_weather", "get_time")
        raw = create(family, model, tool_choice=tool_choice, parallel_tool_calls=False, seed=seed)
        assert "x-millm-ignored-fields" not in raw.headers  # strict is honoured, not reported
        choice = raw.parse().choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content, choice
        assert len(choice.message.tool_calls) == 1
        assert_calls_valid(choice.message.tool_calls, names)
    with family.chat.completions.stream(
        model=model,
        messages=QUESTION,
        tools=STRICT_TOOLS,
        tool_choice="required",
        max_tokens=150,
        temperature=1.0,
        seed=3,
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    assert_calls_valid(final.choices[0].message.tool_calls)
    for seed in (4, 5):  # auto: the random model writes text (never call syntax) or valid calls
        choice = create(family, model, seed=seed, max_tokens=40).parse().choices[0]
        if choice.message.tool_calls:
            assert_calls_valid(choice.message.tool_calls)
        assert not any(marker in (choice.message.content or "") for marker in CALL_MARKERS), choice


def test_the_responses_api_echoes_strict_and_holds_calls_to_it(family_server):
    tools = [{"type": "function", **t["function"]} for t in STRICT_TOOLS]
    body = {
        "model": "tiny-qwen25",
        "input": "Weather?",
        "tools": tools,
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }
    with family_server.http() as http:
        for seed in (0, 1):
            response = http.post("/v1/responses", json={**body, "max_output_tokens": 150, "seed": seed})
            assert response.status_code == 200, response.text
            assert "x-millm-ignored-fields" not in response.headers
            result = response.json()
            assert [tool["strict"] for tool in result["tools"]] == [True, True]
            calls = [item for item in result["output"] if item["type"] == "function_call"]
            assert calls, result["output"]
            for call in calls:
                jsonschema.validate(json.loads(call["arguments"]), SHORT_SCHEMAS[call["name"]])
        loose = {**body, "tools": [{k: v for k, v in t.items() if k != "strict"} for t in tools]}
        response = http.post("/v1/responses", json={**loose, "max_output_tokens": 150, "seed": 0})
        assert [tool["strict"] for tool in response.json()["tools"]] == [False, False]


def test_the_responses_api_streams_strict_calls(family_server):
    client = family_server.openai()
    tools = [{"type": "function", **t["function"]} for t in STRICT_TOOLS]
    with client.responses.stream(
        model="tiny-lfm2",
        input="Weather?",
        tools=tools,
        tool_choice="required",
        max_output_tokens=150,
        temperature=1.0,
        extra_body={"seed": 4},
    ) as stream:
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert calls and all(tool.strict for tool in final.tools)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), SHORT_SCHEMAS[call.name])


TAGS = {
    "type": "function",
    "function": {
        "name": "tag",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
            "required": ["tags"],
        },
    },
}


def test_a_strict_call_is_validated_and_a_schema_it_cannot_enforce_refused(family_server):
    """uniqueItems is checked on the finished call (the script overrides the grammar to break it)."""
    body = {"model": "tiny-qwen25", "messages": QUESTION, "tools": [TAGS], "max_tokens": 60}
    repeated = '<tool_call>\n{"name": "tag", "arguments": {"tags": ["a", "a"]}}\n</tool_call>'
    with family_server.http() as http:
        assert_error(
            http.post("/v1/chat/completions", json=body, headers=scripted(repeated)), 500, "constrained_output_invalid"
        )
        response = http.post("/v1/chat/completions", json=body, headers=scripted(repeated.replace('"a"]', '"b"]')))
        assert response.status_code == 200 and response.json()["choices"][0]["finish_reason"] == "tool_calls"
        chunks = sse_events_of(http, {**body, "stream": True}, scripted(repeated))
        (verdict,) = next(c for c in chunks if isinstance(c, dict) and "millm_validation" in c)["millm_validation"]
        assert verdict["status"] == "invalid" and "non-unique" in verdict["message"]
        negated = {"tags": {"not": {"type": "null"}}}
        unenforceable = {
            **TAGS,
            "function": {**TAGS["function"], "parameters": {"type": "object", "properties": negated}},
        }
        refused = http.post("/v1/chat/completions", json={**body, "tools": [unenforceable]})
        assert_error(refused, 400, "field_not_honoured", "tools[0].function.parameters")


def sse_events_of(http, body, headers):
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        assert response.status_code == 200
        return sse_events(response)
