"""Every error code: status, code, param, OpenAI's ErrorResponse shape.

In-process on the echo engine (the host's logic); one check goes through a real server's socket.
"""

from __future__ import annotations

import json

import httpx
import pytest

from millm_host.testing import assert_error, chat_body


@pytest.fixture(scope="module")
def server(echo_app):
    return echo_app


@pytest.fixture(scope="module")
def model(server) -> str:
    return server.model_id


def _post_raw(server, content: bytes, content_type: str = "application/json", path: str = "/v1/chat/completions"):
    with server.http() as http:
        return http.post(path, content=content, headers={"content-type": content_type})


def test_non_json_media_type_is_415(server, model):
    response = _post_raw(server, b"model=x", "application/x-www-form-urlencoded")
    assert_error(response, 415, "unsupported_media_type")


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[1, 2]",
        b'"text"',
        b'{"model": "x", "temperature": NaN}',
        b'{"model": "x", "temperature": Infinity}',
        b'{"model": "x", "top_p": 1e999}',
        b"\xff\xfe{}",
        b"",
    ],
)
def test_malformed_bodies_are_400(server, content):
    assert_error(_post_raw(server, content), 400, "invalid_parameter" if content else "invalid_request")


def test_deeply_nested_json_is_400(server, model):
    nested = "[" * 5000 + "]" * 5000
    content = f'{{"model": "{model}", "messages": {nested}}}'.encode()
    assert_error(_post_raw(server, content), 400, "invalid_parameter")


def test_body_over_the_limit_is_413(server, model):
    content = json.dumps(chat_body(model, content="x" * (5 * 1024 * 1024))).encode()
    assert_error(_post_raw(server, content), 413, "request_too_large")


def test_missing_and_wrong_typed_fields_name_the_parameter(server, model):
    with server.http() as http:
        missing = http.post("/v1/chat/completions", json={"model": model})
        wrong_role = http.post(
            "/v1/chat/completions", json={"model": model, "messages": [{"role": "robot", "content": "x"}]}
        )
        wrong_content = http.post(
            "/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": 5}]}
        )
        no_model = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert_error(missing, 400, "invalid_parameter", "messages")
    assert_error(wrong_role, 400, "invalid_parameter", "messages[0].role")
    assert_error(wrong_content, 400, "invalid_parameter", "messages[0].content")
    assert_error(no_model, 400, "invalid_parameter", "model")


def test_unknown_model_is_404(server):
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=chat_body("gpt-17"))
    assert_error(response, 404, "model_not_found", "model")


def test_context_length_exceeded_names_limit_and_request(server, model):
    long_prompt = "hello " * 600  # over the echo model's 512-token window
    with server.http() as http:
        chat = http.post("/v1/chat/completions", json=chat_body(model, content=long_prompt, max_tokens=5))
        with http.stream(
            "POST", "/v1/chat/completions", json=chat_body(model, content=long_prompt, max_tokens=5, stream=True)
        ) as streamed:
            streamed.read()
        completion = http.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 600})
    error = assert_error(chat, 400, "context_length_exceeded", "messages")
    assert "512" in error["message"]
    assert_error(streamed, 400, "context_length_exceeded")  # refused before the stream starts
    error = assert_error(completion, 400, "context_length_exceeded", "max_tokens")
    assert "512" in error["message"] and "600" in error["message"]


def test_server_keeps_serving_after_errors(server, model):
    _post_raw(server, b"\x00\x01garbage")
    reply = server.openai().chat.completions.create(
        model=model, messages=[{"role": "user", "content": "ok"}], max_tokens=2
    )
    assert reply.choices[0].message.role == "assistant"


def test_management_errors_are_openai_shaped(server):
    with server.http() as http:
        assert_error(http.get("/api/models/nope"), 404, "model_not_found", "model")
        assert_error(http.post("/api/models/nope/load"), 404, "model_not_found", "model")


def test_plain_http_client_gets_json_errors_over_the_wire(tiny_server):
    response = httpx.post(
        f"{tiny_server.base_url}/v1/completions", content=b"{}", headers={"content-type": "application/json"}
    )
    assert_error(response, 400, "invalid_parameter")
