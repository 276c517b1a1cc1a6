"""``/openapi.json`` describes the whole server (issue 12 §5): every route, valid, and true to real responses.

The fuzzing of the document lives in ``test_openapi_fuzz.py``; the client generated
from it, against a real server, in ``test_openapi_client.py``.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator

from millm_host.testing import chat_body, sse_events


@pytest.fixture(scope="module")
def full_app(app_factory):
    """Every installed plugin, on the echo engine."""
    return app_factory(plugins="all")


@pytest.fixture(scope="module")
def document(full_app) -> dict[str, Any]:
    with full_app.http() as http:
        return http.get("/openapi.json").json()


def routed_operations(app) -> set[tuple[str, str]]:
    """(path, METHOD) of every HTTP responder the Falcon app routes to (its own default responders aside).

    WebSocket responders are not HTTP operations (OpenAPI 3.1 cannot describe them): they are
    left out here as the document leaves them out, and checked apart below."""
    found: set[tuple[str, str]] = set()
    nodes = list(app._router._roots)
    while nodes:
        node = nodes.pop()
        nodes.extend(node.children)
        for method, responder in (node.method_map or {}).items():
            if getattr(responder, "__self__", None) is node.resource and method != "WEBSOCKET":
                found.add((node.uri_template, method))
    return found


def test_the_document_is_valid_openapi_3_1(document):
    OpenAPIV31SpecValidator(document).validate()


def test_every_routed_operation_is_in_the_document(full_app, document):
    documented = {(path, method.upper()) for path, ops in document["paths"].items() for method in ops}
    routed = routed_operations(full_app.app)
    assert routed - documented == set()
    assert documented - routed == set()
    # the plugins' routes too
    assert {("/api/probes/score", "POST"), ("/api/steering", "PUT"), ("/api/models/{model_id}/load", "POST")} <= routed


def test_websocket_routes_are_left_out_of_the_document(full_app, document):
    """The probes' live feed is a WebSocket: routed, yet no path of the document (OpenAPI has no WebSockets)."""
    node = next(n for n in _nodes(full_app.app) if n.uri_template == "/api/probes/feed")
    assert set(node.method_map) >= {"WEBSOCKET"}
    assert "/api/probes/feed" not in document["paths"]


def _nodes(app):
    nodes = list(app._router._roots)
    while nodes:
        node = nodes.pop()
        nodes.extend(node.children)
        yield node


def test_every_operation_is_described(document):
    """A summary, a typed success body, and only errors in OpenAI's shape (Anthropic's on its Messages API)."""
    for path, ops in document["paths"].items():
        shape = "MessagesErrorResponse" if path.startswith("/v1/messages") else "ErrorResponse"
        for method, op in ops.items():
            assert op.get("summary"), f"{method} {path} is not described (@operation on its responder)"
            for status, response in op["responses"].items():
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": f"#/components/schemas/{shape}"}, (method, path, status)


def test_request_schemas_carry_the_plugins_fields(document):
    chat = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"messages", "response_format", "tools", "tool_choice", "steering", "profile"} <= set(chat)
    completion = document["components"]["schemas"]["CompletionRequest"]["properties"]
    assert {"prompt", "steering"} <= set(completion) and "tools" not in completion


def test_statuses_follow_the_route(document):
    def statuses(path: str, method: str) -> set[int]:
        return {int(s) for s in document["paths"][path][method]["responses"]}

    assert statuses("/api/health", "get") == {200, 400, 500}
    assert statuses("/v1/models/{model_id}", "get") == {200, 400, 404, 500}
    assert {413, 415, 503} <= statuses("/v1/chat/completions", "post")
    assert 413 not in statuses("/api/profiles/deactivate", "post")  # reads no body


def test_api_keys_add_401_where_they_apply(app_factory):
    with app_factory(env={"MILLM_API_KEYS": "k"}).http(headers={"Authorization": "Bearer k"}) as http:
        doc = http.get("/openapi.json").json()
    assert "401" in doc["paths"]["/v1/models"]["get"]["responses"]
    assert "401" not in doc["paths"]["/api/health"]["get"]["responses"]


def _schema(document, path: str, method: str, status: int, media: str = "application/json") -> dict[str, Any]:
    schema = document["paths"][path][method]["responses"][str(status)]["content"][media]["schema"]
    return {**schema, "components": document["components"]}  # "#/components/..." resolves in the wrapper


def _holds(document, body: Any, path: str, method: str, status: int, media: str = "application/json") -> None:
    jsonschema.Draft202012Validator(_schema(document, path, method, status, media)).validate(body)


def test_real_responses_match_the_document(full_app, document):
    model = full_app.model_id
    with full_app.http() as http:
        chat = http.post("/v1/chat/completions", json=chat_body(model, max_tokens=3))
        text = http.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 3})
        models = http.get("/v1/models")
        one = http.get(f"/v1/models/{model}")
        health = http.get("/api/health")
        inference = http.get("/api/health/inference")
        managed = http.get("/api/models")
        missing = http.get("/v1/models/nope")
        with http.stream("POST", "/v1/chat/completions", json=chat_body(model, max_tokens=3, stream=True)) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            chunks = [e for e in sse_events(stream) if e != "[DONE]"]
    for response, path, method in [
        (chat, "/v1/chat/completions", "post"),
        (text, "/v1/completions", "post"),
        (models, "/v1/models", "get"),
        (one, "/v1/models/{model_id}", "get"),
        (health, "/api/health", "get"),
        (inference, "/api/health/inference", "get"),
        (managed, "/api/models", "get"),
    ]:
        assert response.status_code == 200, response.text
        _holds(document, response.json(), path, method, 200)
    assert missing.status_code == 404
    _holds(document, missing.json(), "/v1/models/{model_id}", "get", 404)
    assert chunks
    for chunk in chunks:
        _holds(document, chunk, "/v1/chat/completions", "post", 200, "text/event-stream")


def test_real_messages_responses_match_the_document(full_app, document):
    """Anthropic's Messages API: the message, its stream's events, the count and a refusal, as documented."""
    model = full_app.model_id
    body = {"model": model, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    with full_app.http() as http:
        message = http.post("/v1/messages", json=body)
        count = http.post("/v1/messages/count_tokens", json={"model": model, "messages": body["messages"]})
        refused = http.post("/v1/messages", json={**body, "max_tokens": "3"})
        with http.stream("POST", "/v1/messages", json={**body, "stream": True}) as stream:
            events = list(sse_events(stream))
    assert message.status_code == count.status_code == 200
    _holds(document, message.json(), "/v1/messages", "post", 200)
    _holds(document, count.json(), "/v1/messages/count_tokens", "post", 200)
    assert refused.status_code == 400
    _holds(document, refused.json(), "/v1/messages", "post", 400)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    for event in events:
        _holds(document, event, "/v1/messages", "post", 200, "text/event-stream")
