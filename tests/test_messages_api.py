"""``POST /v1/messages`` in-process, on the echo engine: translation, shapes, events, field rules, errors.

The echo engine repeats the last user message, one token per character. The anthropic SDK against a
real server (tools, count_tokens, greedy answers equal to chat's) is in ``tests/clients/test_anthropic_sdk.py``.
"""

from __future__ import annotations

import pytest

from millm_host.serving.messages_api.translate import translate
from millm_host.testing.sse import stream_post

HI = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def http(echo_app):
    with echo_app.http() as client:
        yield client


def create(http, **fields):
    return http.post("/v1/messages", json={"model": "echo", "max_tokens": 32, "messages": HI, **fields})


def ok(response) -> dict:
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["type"] == "message" and body["role"] == "assistant"
    return body


def refused(response, status: int, param: str | None, kind: str = "invalid_request_error") -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert body["error"].get("param") == param
    return body["error"]


def test_a_message_is_the_chat_completions_answer(http):
    chat = http.post("/v1/chat/completions", json={"model": "echo", "messages": HI, "max_tokens": 32}).json()
    body = ok(create(http))
    assert body["id"].startswith("msg_") and body["model"] == "echo"
    assert body["content"] == [{"type": "text", "text": chat["choices"][0]["message"]["content"]}]
    assert body["stop_reason"] == "end_turn" and body["stop_sequence"] is None
    assert body["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert body["usage"]["output_tokens"] == chat["usage"]["completion_tokens"] == len("Hello there")


def test_max_tokens_and_stop_sequences_say_why_the_answer_ended(http):
    cut = ok(create(http, max_tokens=4))
    assert cut["content"][0]["text"] == "Hell" and cut["stop_reason"] == "max_tokens"
    stopped = ok(create(http, stop_sequences=["zz", "o t"]))
    assert stopped["content"][0]["text"] == "Hell"
    assert stopped["stop_reason"] == "stop_sequence" and stopped["stop_sequence"] == "o t"


def test_system_blocks_are_one_system_message(http):
    as_text = ok(create(http, system="Be brief."))
    as_blocks = ok(create(http, system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]))
    bare = ok(create(http))
    assert as_text["usage"]["input_tokens"] == as_blocks["usage"]["input_tokens"] > bare["usage"]["input_tokens"]


def test_the_stream_is_anthropics_events(http):
    response, events = stream_post(
        http, "/v1/messages", {"model": "echo", "max_tokens": 32, "messages": HI, "stream": True}
    )
    assert response.status_code == 200 and response.headers["x-millm-model"] == "echo"
    kinds = [event["type"] for event in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "[DONE]" not in events
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == "Hello there"
    delta = events[-2]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == len(text)


def test_tool_turns_become_chat_tool_calls_and_tool_messages():
    body = {
        "model": "echo",
        "max_tokens": 8,
        "system": "sys",
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny", "is_error": True},
                    {"type": "text", "text": "thanks", "cache_control": {"type": "ephemeral"}},
                ],
            },
        ],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "u"},
        "seed": 3,
    }
    translation = translate(body, strict=False)
    chat = translation.chat
    assert chat["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ]
    assert translation.sources == ["system", "messages[0]", "messages[1]", "messages[2]", "messages[2]"]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["seed"] == 3 and chat["max_tokens"] == 8 and "metadata" not in chat
    assert translation.reported == [
        "messages[2].content[0].is_error",
        "messages[2].content[1].cache_control",
        "metadata",
    ]
    assert translation.param("stop") == "stop_sequences"
    assert translation.param("tools[0].function.parameters.properties") == "tools[0].input_schema.properties"
    assert translation.param("messages[3].content") == "messages[2].content"
    assert translation.param("tool_choice.function.name") == "tool_choice.name"


def test_ignored_fields_are_reported_and_strict_refuses_them(http):
    response = create(http, metadata={"user_id": "u"}, service_tier="auto")
    ok(response)
    assert response.headers["x-millm-ignored-fields"] == '"metadata"'
    strict = http.post(
        "/v1/messages",
        json={"model": "echo", "max_tokens": 4, "messages": HI, "metadata": {"user_id": "u"}},
        headers={"X-miLLM-Strict": "true"},
    )
    assert refused(strict, 400, "metadata")["code"] == "unused_fields_refused"


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"max_tokens": None}, "max_tokens", "invalid_parameter"),
        ({"temperature": 1.5}, "temperature", "invalid_parameter"),
        ({"top_k": 5}, "top_k", "field_not_honoured"),
        ({"thinking": {"type": "sometimes"}}, "thinking", "invalid_parameter"),
        ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens", "invalid_parameter"),
        ({"stop": "x"}, "stop", "field_not_honoured"),
        ({"stop_sequences": ["x"] * 17}, "stop_sequences", "invalid_parameter"),
        ({"messages": [{"role": "assistant", "content": "Hi"}]}, "messages", "invalid_parameter"),
        ({"messages": [{"role": "user", "content": []}]}, "messages[0].content", "invalid_parameter"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages[0].content[0].type",
            "field_not_honoured",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]},
            "messages[0].content[0].type",
            "invalid_parameter",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": 3}]}
                ]
            },
            "messages[0].content[0].input",
            "invalid_parameter",
        ),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name", "invalid_parameter"),
        ({"output_config": {"format": {"type": "xml"}}}, "output_config.format", "invalid_parameter"),
    ],
)
def test_bad_fields_are_refused_naming_them(http, fields, param, code):
    body = {"model": "echo", "max_tokens": 8, "messages": HI, **fields}
    body = {key: value for key, value in body.items() if value is not None}
    assert refused(http.post("/v1/messages", json=body), 400, param)["code"] == code


def test_top_k_is_served_where_it_is_greedy_or_no_cut(http):
    for fields in ({"top_k": 1}, {"top_k": 0}, {"top_k": 40, "temperature": 0}):
        assert ok(create(http, **fields))["content"][0]["text"] == "Hello there"


def test_count_tokens_is_the_prompt_of_the_message(http):
    body = {"model": "echo", "system": "Be brief.", "messages": HI}
    count = http.post("/v1/messages/count_tokens", json=body)
    assert count.status_code == 200 and set(count.json()) == {"input_tokens"}
    message = ok(http.post("/v1/messages", json={**body, "max_tokens": 4}))
    assert count.json()["input_tokens"] == message["usage"]["input_tokens"]
    refused(http.post("/v1/messages/count_tokens", json={"model": "echo"}), 400, "messages")


def test_unknown_model_and_routes_are_refused_in_anthropics_shape(http):
    refused(create(http, model="nope"), 404, "model", "not_found_error")
    refused(http.get("/v1/messages"), 405, None)


@pytest.fixture(scope="module")
def faulty(app_factory):
    return app_factory(plugins=["fault_injection"], env={"FAULT_INJECTION": "token:3"})


def test_a_failure_is_an_error_event_or_an_api_error(faulty):
    with faulty.http() as http:
        _, events = stream_post(
            http,
            "/v1/messages",
            {"model": "echo", "max_tokens": 20, "messages": [{"role": "user", "content": "FAULT"}], "stream": True},
        )
        whole = http.post(
            "/v1/messages", json={"model": "echo", "max_tokens": 20, "messages": [{"role": "user", "content": "FAULT"}]}
        )
    assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == "api_error"
    assert events[-1]["error"]["code"] == "injected_fault"
    assert "message_stop" not in [event["type"] for event in events]
    assert refused(whole, 500, None, "api_error")["code"] == "injected_fault"
