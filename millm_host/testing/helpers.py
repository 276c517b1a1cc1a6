"""One helper per job for the tests of the host and every plugin: requests and error checks.

Each works with a real server (``ServerProcess``) or an in-process app
(``AppServer``): ``client`` is what their ``http()`` returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx

from .sse import sse_events, stream_post

__all__ = ["assert_error", "chat", "chat_body", "sse_events", "stream_post"]

_ANY: Any = ...


def chat_body(model: str, content: str = "Hello there", **fields: Any) -> dict[str, Any]:
    """A chat completion request with one user message; ``fields`` add to it (``messages`` replaces it)."""
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}


def chat(
    client: httpx.Client,
    model: str,
    content: str = "Hello there",
    *,
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> httpx.Response:
    """POST ``chat_body(model, content, **fields)`` to ``/v1/chat/completions``; the response, whatever its status."""
    return client.post("/v1/chat/completions", json=chat_body(model, content, **fields), headers=headers)


def assert_error(response: httpx.Response, status: int, code: str, param: str | None = _ANY) -> dict[str, Any]:
    """Check an OpenAI-shaped error (status, code, param, OpenAI's ErrorResponse schema); return its ``error``.

    ``param`` is checked only when given (``None`` checks that it is null).
    """
    from .openai_schema import validate_openai

    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    validate_openai("ErrorResponse", body)
    error = body["error"]
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"], error
    if param is not _ANY:
        assert error["param"] == param, error
    if status == 503:  # every 503 says when to retry
        assert int(response.headers["retry-after"]) >= 1, response.headers
    return error


def run_together(work: Callable[[int], Any], count: int) -> None:
    """Call ``work(0)`` … ``work(count - 1)`` on threads released at once (a barrier), and wait for all."""
    start = threading.Barrier(count)

    def run(index: int) -> None:
        start.wait()
        work(index)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
