"""Small helpers shared by the cross-package tests."""

from __future__ import annotations

import json
from typing import Any

import httpx

from millm_host.testing.openai_schema import validate_openai


def sse_events(response: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of an SSE response: dicts, and the string ``[DONE]``."""
    events: list[Any] = []
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        payload = line[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def stream_post(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[Any]]:
    with client.stream("POST", path, json=body) as response:
        response.read()
        return response, sse_events(response) if response.status_code == 200 else []


def assert_error(response: httpx.Response, status: int, code: str, param: str | None = ...) -> dict[str, Any]:
    """Check an OpenAI-shaped error: status, code, param, and OpenAI's ErrorResponse schema."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    validate_openai("ErrorResponse", body)
    error = body["error"]
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    if param is not ...:
        assert error["param"] == param, error
    return error


def chat_body(model: str, content: str = "Hello there", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}
