"""``/v1/responses`` with function tools and ``text.format``, through the openai SDK, on tiny models.

The Responses request is served as a chat completion, so this plugin's tool and
constraint machinery applies; these check the Responses shapes around it.
"""

from __future__ import annotations

import json
from typing import Literal

import pydantic
import pytest

from millm_host.testing import assert_error
from millm_host.testing.openai_schema import validate_openai, validate_openai_event

from .family import scripted

MODEL = "tiny-qwen25"
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def client(family_server):
    return family_server.openai()


@pytest.fixture(scope="module")
def http(family_server):
    with family_server.http() as c:
        yield c


def test_required_tool_choice_answers_a_function_call_item(client):
    response = client.responses.create(
        model=MODEL,
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=80,
        extra_headers=scripted(HERMES_CALL),
    )
    validate_openai("Response", response.model_dump(mode="json", exclude_unset=True))
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.call_id.startswith("call_") and json.loads(call.arguments) == {"city": "Paris"}
    assert response.status == "completed" and response.tools[0].name == "get_weather"


def test_text_then_call_streams_a_message_then_a_function_call(client):
    with client.responses.stream(
        model=MODEL,
        input="Weather in Paris?",
        tools=[WEATHER],
        max_output_tokens=80,
        extra_headers=scripted("One moment. " + HERMES_CALL),
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    for event in events:
        validate_openai_event(event.model_dump(mode="json", exclude_unset=True))
    kinds = [e.type for e in events]
    assert "response.output_text.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert kinds.index("response.output_text.done") < kinds.index("response.function_call_arguments.done")
    message, call = final.output
    assert message.type == "message" and message.content[0].text == "One moment. "
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_function_call_and_its_output_are_the_conversation(http):
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    chat_history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    tools = [WEATHER]
    chat_tools = [{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}]
    reply = scripted("It is sunny.")
    response = http.post(
        "/v1/responses", json={"model": MODEL, "input": history, "tools": tools, "max_output_tokens": 20}, headers=reply
    )
    chat = http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": chat_history, "tools": chat_tools, "max_tokens": 20},
        headers=reply,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["input_tokens"] == chat.json()["usage"]["prompt_tokens"]
    assert response.json()["output"][0]["content"][0]["text"] == "It is sunny."


class Judge(pydantic.BaseModel):
    label: Literal["humor", "not_humor"]
    sure: bool


def test_parse_with_a_pydantic_text_format(client):
    response = client.responses.parse(
        model=MODEL,
        input="Is this funny?",
        text_format=Judge,
        max_output_tokens=40,
        temperature=1.0,
        extra_body={"seed": 3},
    )
    assert isinstance(response.output_parsed, Judge)
    assert response.text.format.type == "json_schema"


def test_a_streamed_pydantic_text_format(client):
    """``text.format`` streamed: every prefix is kept valid, the completed response parses as the model."""
    with client.responses.stream(
        model=MODEL,
        input="Is this funny?",
        text_format=Judge,
        max_output_tokens=40,
        temperature=1.0,
        extra_body={"seed": 3},
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        response = stream.get_final_response()
    assert deltas and isinstance(response.output_parsed, Judge)
    assert "".join(deltas) == response.output_text


def test_json_object_format(http):
    body = {
        "model": MODEL,
        "input": "JSON please",
        "text": {"format": {"type": "json_object"}},
        "max_output_tokens": 40,
    }
    response = http.post("/v1/responses", json={**body, "temperature": 1.0, "seed": 1})
    assert response.status_code == 200, response.text
    text = response.json()["output"][0]["content"][0]["text"]
    if response.json()["status"] == "completed":
        assert isinstance(json.loads(text), dict)
    assert response.headers["x-millm-constrained"] == "json_object"


def test_tools_with_a_format_answer_a_call_or_the_document(http):
    """Both in one request, as OpenAI allows: one grammar makes a random model's reply either one, valid."""
    label = {"type": "object", "properties": {"label": {"enum": ["a", "b"]}}, "required": ["label"]}
    text = {"format": {"type": "json_schema", "name": "label", "schema": label}}
    short = {**WEATHER, "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}}}
    body = {"model": MODEL, "input": "x", "tools": [short], "text": text, "max_output_tokens": 150, "seed": 0}
    response = http.post("/v1/responses", json={**body, "tool_choice": "required"})
    assert response.status_code == 200, response.text
    (call,) = response.json()["output"]
    assert call["type"] == "function_call" and set(json.loads(call["arguments"])) <= {"city"}
    response = http.post("/v1/responses", json={**body, "tool_choice": "none"})
    assert response.status_code == 200, response.text
    assert json.loads(response.json()["output"][0]["content"][0]["text"])["label"] in ("a", "b")


def test_a_named_tool_choice(http):
    body = {
        "model": MODEL,
        "input": "Weather in Paris?",
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 80,
    }
    response = http.post("/v1/responses", json=body, headers=scripted(HERMES_CALL))
    assert response.status_code == 200, response.text
    (call,) = response.json()["output"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    unknown = {**body, "tool_choice": {"type": "function", "name": "nope"}}
    assert_error(http.post("/v1/responses", json=unknown), 400, "invalid_parameter", "tool_choice.name")
