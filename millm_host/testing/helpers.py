"""One helper per job for the tests of the host and every plugin: requests and error checks.

Each works with a real server (``ServerProcess``) or an in-process app
(``AppServer``): ``client`` is what their ``http()`` returns.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from .sse import sse_events, stream_post

__all__ = [
    "BODY_LIMIT",
    "HEALTH_BOUND_S",
    "assert_error",
    "chat",
    "chat_body",
    "health_while",
    "just_under_the_limit",
    "sse_events",
    "stream_post",
]

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


def post_retrying_busy(base: str, path: str, body: dict[str, Any], tries: int = 100) -> httpx.Response:
    """POST ``body`` to ``base + path`` on a new connection, retrying a 503 (a worker or replica still loading
    or converging answers so, with Retry-After) as clients do; the last answer."""
    for _ in range(tries):
        reply = httpx.post(f"{base}{path}", timeout=60, json=body)
        if reply.status_code != 503:
            break
        time.sleep(0.2)
    return reply


def sent_raw(base_url: str, path: str, body: dict[str, Any]) -> socket.socket:
    """A socket that has sent ``body`` as one whole POST to ``path`` and reads nothing yet: a client that
    can leave at any moment (close it), streamed or not."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", int(base_url.rsplit(":", 1)[1])))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


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


# --- issue 11 §0: the event loop while one large body is handled ---------------------

BODY_LIMIT = 4 * 1024 * 1024  # MILLM_MAX_BODY_BYTES' default
#: Generous: a blocked event loop answered after 19.5 s at 64 KB, and hours at 4 MiB.
HEALTH_BOUND_S = 1.0


def just_under_the_limit(prefix: bytes, unit: bytes, suffix: bytes = b"") -> bytes:
    count = (BODY_LIMIT - 64 - len(prefix) - len(suffix)) // len(unit)
    return prefix + unit * count + suffix


def health_while(server, method: str, path: str, body: bytes) -> tuple[httpx.Response, float]:
    """Send one request while ``/api/health`` is asked again and again; (its response, the slowest health answer)."""
    slowest = [0.0]
    polled = threading.Event()
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=server.base_url, timeout=10) as http:
            while not done.is_set():
                started = time.monotonic()
                try:
                    http.get("/api/health").raise_for_status()
                except httpx.HTTPError:
                    slowest[0] = math.inf
                    return
                slowest[0] = max(slowest[0], time.monotonic() - started)
                polled.set()
                time.sleep(0.005)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        assert polled.wait(30), "health never answered"
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            response = http.request(method, path, content=body, headers={"content-type": "application/json"})
        time.sleep(0.05)
    finally:
        done.set()
        poller.join(30)
    return response, slowest[0]
