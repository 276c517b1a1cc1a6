"""Small helpers shared by the cross-package tests."""

from __future__ import annotations

from typing import Any

import httpx

from millm_host.testing.openai_schema import validate_openai
from millm_host.testing.sse import sse_events, stream_post

__all__ = ["assert_error", "chat_body", "sse_events", "stream_post"]


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
    if status == 503:  # every 503 says when to retry
        assert int(response.headers["retry-after"]) >= 1, response.headers
    return error


def chat_body(model: str, content: str = "Hello there", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}
