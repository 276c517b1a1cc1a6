"""Tools with a response_format, calls cut by ``max_tokens``, and calls streamed as they are written.

Through the openai SDK against real servers: ``tiny_server`` (``millm serve`` on a
tiny random model with SmolLM2's template: the generic format) and
``family_server`` (tiny random models with each family's template: the native
formats). On random weights only the grammar makes a reply a valid call or a
valid document, so every reply here is checked against the schemas. Cuts use
scripted replies (``X-Test-Scripted-Output``), so that a known call is cut at a
known token.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import transformers

from .family import scripted
from .test_generic_tools import QUESTION, SHORT_SCHEMAS, SHORT_TIME, SHORT_WEATHER, assert_valid_calls

LABEL = {
    "type": "object",
    "properties": {"label": {"enum": ["humor", "not_humor"]}},
    "required": ["label"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "judge", "strict": True, "schema": LABEL}}
FAMILIES = ["tiny-qwen25", "tiny-llama31", "tiny-lfm2"]


@pytest.fixture(scope="module")
def generic(tiny_server):
    return tiny_server.openai(), tiny_server.model_id


@pytest.fixture(scope="module")
def family(family_server):
    return family_server.openai()


def create(client, model, **body):
    body = {
        "messages": QUESTION,
        "tools": [SHORT_WEATHER, SHORT_TIME],
        "response_format": RESPONSE_FORMAT,
        "max_tokens": 150,  # tiny-llama31's prompt is 333 tokens of its 512
        "temperature": 1.0,
        **body,
    }
    return client.chat.completions.create(model=model, **body)


def assert_call_or_document(choice) -> str:
    """The choice is valid calls or a complete document in the schema; which one."""
    if choice.finish_reason == "tool_calls":
        assert_valid_calls(choice.message)
        return "call"
    assert choice.finish_reason == "stop" and not choice.message.tool_calls, choice
    jsonschema.validate(json.loads(choice.message.content), LABEL)
    return "document"


# --- item: tools and response_format together, one grammar ----------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_generic_required_with_a_response_format_is_a_valid_call(generic, seed):
    client, model = generic
    choice = create(client, model, tool_choice="required", seed=seed).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert_valid_calls(choice.message)


def test_generic_named_function_with_a_response_format(generic):
    client, model = generic
    named = {"type": "function", "function": {"name": "get_time"}}
    choice = create(client, model, tool_choice=named, seed=3).choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    assert_valid_calls(choice.message, names=("get_time",))


def test_generic_none_with_a_response_format_is_the_document(generic):
    client, model = generic
    response = create(client, model, tool_choice="none", seed=0)
    assert assert_call_or_document(response.choices[0]) == "document"


def test_generic_auto_with_a_response_format_is_a_call_or_the_document(generic):
    client, model = generic
    for seed in range(4):
        assert_call_or_document(create(client, model, seed=seed).choices[0])


def test_generic_streamed_with_a_response_format(generic):
    client, model = generic
    for seed in range(3):
        with client.chat.completions.stream(
            model=model,
            messages=QUESTION,
            tools=[SHORT_WEATHER, SHORT_TIME],
            response_format=RESPONSE_FORMAT,
            max_tokens=200,
            temperature=1.0,
            seed=seed,
        ) as stream:
            final = stream.get_final_completion()
        assert_call_or_document(final.choices[0])


@pytest.mark.parametrize("model", FAMILIES)
def test_native_required_with_a_response_format_is_a_valid_call(family, model):
    choice = create(family, model, tool_choice="required", seed=0).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    assert_valid_calls(choice.message)


@pytest.mark.parametrize("model", FAMILIES)
def test_native_named_function_with_a_response_format(family, model):
    named = {"type": "function", "function": {"name": "get_weather"}}
    choice = create(family, model, tool_choice=named, seed=1).choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
    assert_valid_calls(choice.message, names=("get_weather",))


@pytest.mark.parametrize("model", FAMILIES)
def test_native_none_and_auto_with_a_response_format(family, model):
    assert assert_call_or_document(create(family, model, tool_choice="none", seed=0).choices[0]) == "document"
    for seed in range(3):
        assert_call_or_document(create(family, model, seed=seed).choices[0])


def test_native_streamed_with_a_response_format(family):
    for tool_choice in ("required", "auto"):
        with family.chat.completions.stream(
            model="tiny-qwen25",
            messages=QUESTION,
            tools=[SHORT_WEATHER, SHORT_TIME],
            tool_choice=tool_choice,
            response_format=RESPONSE_FORMAT,
            max_tokens=200,
            temperature=1.0,
            seed=2,
        ) as stream:
            final = stream.get_final_completion()
        kind = assert_call_or_document(final.choices[0])
        assert tool_choice == "auto" or kind == "call"


# --- item: a call cut by max_tokens is dropped, the complete ones kept ------------------------

HERMES_TWO = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'
)
GENERIC_TWO = (
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"name": "get_time", "arguments": {"city": "Oslo"}}]}'
)


def cut_in_second_call(family_models, model: str, reply: str) -> int:
    """A max_tokens that ends ``reply`` a few tokens into its second call."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(family_models / model)
    first = reply.index("get_time") - 5
    return len(tokenizer(reply[:first], add_special_tokens=False)["input_ids"]) + 4


@pytest.mark.parametrize(("model", "reply"), [("tiny-qwen25", HERMES_TWO), ("tiny-smollm2", GENERIC_TWO)])
@pytest.mark.parametrize("cut", ["second", "first"])
def test_a_call_cut_by_max_tokens_never_leaks(family, family_models, model, reply, cut):
    max_tokens = cut_in_second_call(family_models, model, reply) if cut == "second" else 6
    body = {"messages": QUESTION, "tools": [SHORT_WEATHER, SHORT_TIME], "max_tokens": max_tokens}
    complete = family.chat.completions.create(model=model, **body, extra_headers=scripted(reply)).choices[0]
    assert complete.finish_reason == "length"
    assert complete.message.content in (None, "")  # never the internal format
    kept = [(c.function.name, json.loads(c.function.arguments)) for c in complete.message.tool_calls or ()]
    assert kept == ([("get_weather", {"city": "Paris"})] if cut == "second" else [])

    stream = family.chat.completions.create(model=model, **body, stream=True, extra_headers=scripted(reply))
    chunks = [c for c in stream if c.choices]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_the_responses_api_never_shows_a_cut_call_as_text(family_server, family_models):
    max_tokens = cut_in_second_call(family_models, "tiny-qwen25", HERMES_TWO)
    tools = [{"type": "function", **SHORT_WEATHER["function"]}, {"type": "function", **SHORT_TIME["function"]}]
    with family_server.http() as http:
        response = http.post(
            "/v1/responses",
            json={"model": "tiny-qwen25", "input": "Weather?", "tools": tools, "max_output_tokens": max_tokens},
            headers=scripted(HERMES_TWO),
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "incomplete"
    assert [(item["type"], item.get("name")) for item in body["output"] if item["type"] == "function_call"] == [
        ("function_call", "get_weather")
    ]
    for item in body["output"]:
        for part in item.get("content") or ():
            assert "tool_call" not in part["text"]


# --- item: streamed calls send the name first, then their arguments as they are written -------


@pytest.mark.parametrize(
    ("model", "reply", "tool_choice"),
    [
        ("tiny-smollm2", None, "required"),  # the generic format: a random model's call
        ("tiny-qwen25", None, "required"),  # Hermes: a random model's call
        ("tiny-qwen25", HERMES_TWO, "auto"),  # Hermes: two known calls
    ],
)
def test_streamed_calls_send_the_name_then_argument_deltas(family, model, reply, tool_choice):
    headers = scripted(reply) if reply is not None else {}
    stream = family.chat.completions.create(
        model=model,
        messages=QUESTION,
        tools=[SHORT_WEATHER, SHORT_TIME],
        tool_choice=tool_choice,
        max_tokens=200,
        temperature=1.0,
        seed=0,
        stream=True,
        extra_headers=headers,
    )
    parts = [part for chunk in stream if chunk.choices for part in chunk.choices[0].delta.tool_calls or ()]
    calls: dict[int, dict] = {}
    for part in parts:
        if part.index not in calls:  # the first delta of a call: id, type and name, no arguments yet
            assert part.id.startswith("call_") and part.type == "function" and part.function.name
            assert not part.function.arguments
            calls[part.index] = {"name": part.function.name, "arguments": "", "pieces": 0}
        else:
            assert part.id is None and not part.function.name
            calls[part.index]["arguments"] += part.function.arguments
            calls[part.index]["pieces"] += 1
    assert calls
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), SHORT_SCHEMAS[call["name"]])
    assert max(call["pieces"] for call in calls.values()) > 1  # the arguments arrive as they are generated


def test_the_sdk_stream_helper_accumulates_the_argument_deltas(generic):
    client, model = generic
    with client.chat.completions.stream(
        model=model,
        messages=QUESTION,
        tools=[SHORT_WEATHER, SHORT_TIME],
        tool_choice="required",
        max_tokens=200,
        temperature=1.0,
        seed=1,
    ) as stream:
        arguments_events = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    assert_valid_calls(final.choices[0].message)
    assert len(arguments_events) > 1
    first = final.choices[0].message.tool_calls[0]
    assert "".join(e.arguments_delta for e in arguments_events if e.index == 0) == first.function.arguments
