"""``POST /v1/responses`` in-process, on the echo engine: translation, shapes, events, field rules, errors.

Response objects and stream events are checked against OpenAI's own schemas
(``Response``, ``ResponseStreamEvent``). The openai SDK and real models are in
``tests/test_responses_api_server.py``.
"""

from __future__ import annotations

import pytest

from millm_host.testing import assert_error
from millm_host.testing.openai_schema import validate_openai, validate_openai_event
from millm_host.testing.sse import stream_post


@pytest.fixture(scope="module")
def http(echo_app):
    with echo_app.http() as client:
        yield client


def respond(http, **fields):
    return http.post("/v1/responses", json={"model": "echo", **fields})


def ok(response) -> dict:
    assert response.status_code == 200, response.text
    body = response.json()
    validate_openai("Response", body)
    return body


def output_text(body: dict) -> str:
    return "".join(part["text"] for item in body["output"] if item["type"] == "message" for part in item["content"])


def test_text_input_is_answered_as_a_response_object(http):
    body = ok(respond(http, input="Hello there"))
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["status"] == "completed" and body["error"] is None and body["incomplete_details"] is None
    (item,) = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    assert item["content"][0]["type"] == "output_text"
    assert output_text(body) == "Hello there"  # the echo engine repeats the last user message
    usage = body["usage"]
    assert usage["output_tokens"] == len("Hello there")  # one token per character
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_the_answer_is_the_chat_completions_answer(http):
    chat = http.post("/v1/chat/completions", json={"model": "echo", "messages": [{"role": "user", "content": "Hi"}]})
    body = ok(respond(http, input="Hi"))
    assert body["usage"]["input_tokens"] == chat.json()["usage"]["prompt_tokens"]
    assert output_text(body) == chat.json()["choices"][0]["message"]["content"]


def test_message_items_and_instructions_become_the_conversation(http):
    messages = [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second"},
    ]
    chat = http.post("/v1/chat/completions", json={"model": "echo", "messages": messages})
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "fir"}, {"type": "input_text", "text": "st"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
        {"role": "user", "content": "second"},
    ]
    body = ok(respond(http, input=items, instructions="Be brief"))
    assert body["instructions"] == "Be brief"
    assert body["usage"]["input_tokens"] == chat.json()["usage"]["prompt_tokens"]
    assert output_text(body) == "second"


def test_max_output_tokens_ends_an_incomplete_response(http):
    body = ok(respond(http, input="Hello there", max_output_tokens=3))
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    assert output_text(body) == "Hel" and body["usage"]["output_tokens"] == 3
    assert body["max_output_tokens"] == 3


def test_sampling_and_metadata_are_echoed(http):
    body = ok(respond(http, input="x", temperature=0.5, top_p=0.9, metadata={"k": "v"}))
    assert (body["temperature"], body["top_p"], body["metadata"]) == (0.5, 0.9, {"k": "v"})


def stream(http, **fields) -> list[dict]:
    response, events = stream_post(http, "/v1/responses", {"model": "echo", "stream": True, **fields})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return events


def test_stream_sends_the_responses_events_in_order(http):
    events = stream(http, input="Hey")
    for event in events:
        validate_openai_event(event)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hey"
    assert events[0]["response"]["status"] == "in_progress"
    final = events[-1]["response"]
    validate_openai("Response", final)
    assert output_text(final) == "Hey" and final["usage"]["output_tokens"] == 3
    assert final["id"] == events[0]["response"]["id"]


def test_stream_names_each_event(http):
    with http.stream("POST", "/v1/responses", json={"model": "echo", "input": "Hi", "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line.startswith("event: ")]
    assert lines[0] == "event: response.created" and lines[-1] == "event: response.completed"


def test_stream_cut_by_max_output_tokens_ends_incomplete(http):
    events = stream(http, input="Hello there", max_output_tokens=2)
    assert events[-1]["type"] == "response.incomplete"
    validate_openai_event(events[-1])
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


# --- the field rules ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"truncation": "auto"}, "truncation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type"),
        ({"max_tokens": 5}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}]}, "messages"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format"),  # the echo engine has no constraint
    ],
)
def test_output_changing_fields_are_refused(http, fields, param):
    assert_error(respond(http, **{"input": "x", **fields}), 400, "field_not_honoured", param)


def test_reasoning_items_sent_back_are_left_out(http):
    """An earlier turn's ``reasoning`` output item, sent back in ``input`` as OpenAI asks: accepted, and left
    out of the conversation (chat templates leave earlier thinking out too)."""
    thought = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]}
    turns = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"}]
    without = ok(respond(http, input=[*turns, {"role": "user", "content": "second"}]))
    body = ok(respond(http, input=[turns[0], thought, turns[1], {"role": "user", "content": "second"}]))
    assert body["usage"]["input_tokens"] == without["usage"]["input_tokens"]
    assert output_text(body) == "second"


def test_fields_that_ask_for_nothing_are_accepted_silently(http):
    response = respond(
        http,
        input="x",
        store=False,
        background=False,
        include=[],
        truncation="disabled",
        reasoning=None,
        top_logprobs=0,
    )
    ok(response)
    assert "x-millm-ignored-fields" not in response.headers


def test_fields_that_change_nothing_are_reported(http):
    response = respond(http, input="x", store=True, user="u1", service_tier="flex", foo=1)
    ok(response)
    assert response.headers["x-millm-ignored-fields"] == '"store", "user", "service_tier", "foo"'
    assert_error(
        http.post(
            "/v1/responses", json={"model": "echo", "input": "x", "store": True}, headers={"X-miLLM-Strict": "true"}
        ),
        400,
        "unused_fields_refused",
        "store",
    )


def test_unknown_keys_in_items_are_reported_where_they_are(http):
    response = respond(http, input=[{"role": "user", "content": "x", "weight": 2}])
    ok(response)
    assert response.headers["x-millm-ignored-fields"] == '"input[0].weight"'


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": 3}, "input"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": 3}, "temperature"),
        ({"input": "x", "instructions": 1}, "instructions"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"content": "x"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"input": "x", "metadata": {"k": 1}}, "metadata.k"),
    ],
)
def test_invalid_requests_name_the_responses_parameter(http, fields, param):
    assert_error(respond(http, **fields), 400, "invalid_parameter", param)


def test_context_length_names_max_output_tokens(http):
    assert_error(
        respond(http, input="x", max_output_tokens=100_000), 400, "context_length_exceeded", "max_output_tokens"
    )


def test_unknown_model_is_a_404(http):
    response = http.post("/v1/responses", json={"model": "nope", "input": "x"})
    assert_error(response, 404, "model_not_found")


# --- failures and access -------------------------------------------------------------


@pytest.fixture(scope="module")
def faulty(app_factory):
    return app_factory(plugins=["fault_injection"], env={"FAULT_INJECTION": "token:3"})


def test_mid_stream_failure_is_an_error_event_then_response_failed(faulty):
    with faulty.http() as http:
        events = stream(http, input="FAULT please", max_output_tokens=20)
        healthy = respond(http, input="fine")
    error, failed = events[-2:]
    validate_openai_event(error)
    validate_openai_event(failed)
    assert error["type"] == "error" and error["code"] == "injected_fault" and error["message"]
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "server_error"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    ok(healthy)


def test_non_streamed_failure_is_an_error_response(faulty):
    with faulty.http() as http:
        assert_error(respond(http, input="FAULT", max_output_tokens=20), 500, "injected_fault")


def test_api_keys_guard_responses(app_factory):
    app = app_factory(env={"MILLM_API_KEYS": "secret-key"})
    with app.http() as http:
        assert_error(respond(http, input="x"), 401, "invalid_api_key")
        granted = http.post(
            "/v1/responses", json={"model": "echo", "input": "x"}, headers={"Authorization": "Bearer secret-key"}
        )
    ok(granted)
