"""A request body that stops arriving is dropped after ``MILLM_BODY_TIMEOUT_S`` (slowloris, issue 35 §6).

A raw socket promises a longer body (``Content-Length``) than it sends: the server answers
``408 request_timeout`` in OpenAI's shape and closes the connection. A body that arrives in
pieces, each within the timeout, is served; once a body is complete, a generation may take
longer than the timeout (the wait for a disconnect is not bounded).
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from millm_host.testing import chat_body, stream_post

TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def app(app_factory):
    # slow:2:1: a request mentioning FAULT waits 1 s at its 2nd token, twice the body timeout
    return app_factory(
        plugins=["fault_injection"], env={"MILLM_BODY_TIMEOUT_S": str(TIMEOUT_S), "FAULT_INJECTION": "slow:2:1"}
    )


def _address(app) -> tuple[str, int]:
    return "127.0.0.1", int(app.base_url.rsplit(":", 1)[1])


def _head(app, length: int) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{_address(app)[1]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def _read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection; and when it closed, after the call."""
    sock.settimeout(limit_s)
    started, received = time.monotonic(), b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return received, time.monotonic() - started
        received += chunk


def test_a_body_shorter_than_its_content_length_is_dropped(app):
    body = json.dumps(chat_body(app.model_id, "hello")).encode()
    with socket.create_connection(_address(app)) as sock:
        sock.sendall(_head(app, len(body) + 100) + body)  # 100 bytes promised never come
        sent = time.monotonic()
        received, _ = _read_until_closed(sock, 30)  # closed by the server: no timeout here
        took = time.monotonic() - sent
    head, _, payload = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), received[:300]
    assert b"connection: close" in head.lower(), head
    error = json.loads(payload)["error"]
    assert error["code"] == "request_timeout" and "MILLM_BODY_TIMEOUT_S" in error["message"], error
    assert TIMEOUT_S <= took < TIMEOUT_S + 5, took
    with app.http() as http:  # nothing of it is left waiting
        assert http.get("/api/health").json()["queue"]["admitted"] == 0
    print(f"dropped {took:.2f} s after the last byte (MILLM_BODY_TIMEOUT_S {TIMEOUT_S})")


def test_a_body_sent_in_slow_pieces_is_served(app):
    body = json.dumps(chat_body(app.model_id, "hello")).encode()
    with socket.create_connection(_address(app)) as sock:
        sock.sendall(_head(app, len(body)))
        for start in range(0, len(body), len(body) // 4 + 1):  # four pieces, 0.3 s apart: 1.2 s in all
            time.sleep(TIMEOUT_S * 0.6)
            sock.sendall(body[start : start + len(body) // 4 + 1])
        sock.settimeout(30)
        received = sock.recv(65536)
    assert received.startswith(b"HTTP/1.1 200"), received[:300]


def test_a_generation_may_outlast_the_body_timeout(app):
    with app.http(timeout=30) as http:
        response, events = stream_post(
            http, "/v1/chat/completions", chat_body(app.model_id, "FAULT", max_tokens=4, stream=True)
        )
        served = http.post("/v1/chat/completions", json=chat_body(app.model_id, "FAULT", max_tokens=4))
    assert response.status_code == 200 and events[-1] == "[DONE]", events[-2:]
    assert all("error" not in e for e in events[:-1]), events
    assert served.status_code == 200, served.text
