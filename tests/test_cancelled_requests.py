"""A request whose client has gone costs nothing more: it leaves the queue at once (issue 35 §2).

On the echo engine (serial, its text on the engine thread) with the fault-injection
plugin: a FAULT stream holds the engine thread at its 2nd token, so the requests
behind it wait to be tokenized there. When their clients leave, their places are
freed the moment the server hears of it, not at the waiters' next poll (``TICK``,
a quarter of a second): a drop storm must not fill the queue with the gone.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from millm_host.testing import chat_body

BLOCK_S = 120  # a FAULT request holds the engine thread this long unless cancelled
DROPPED = 12


@pytest.fixture(scope="module")
def app(app_factory):
    return app_factory(plugins=["fault_injection"], env={"FAULT_INJECTION": f"slow:2:{BLOCK_S}"})


def wait_for(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def sent(app, body: dict) -> socket.socket:
    """A socket that has sent ``body`` as a whole chat completion request and reads nothing."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", int(app.base_url.rsplit(":", 1)[1])))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def test_queued_requests_whose_clients_leave_free_their_places_at_once(app):
    """Twelve requests, streamed or not, wait behind a held generation; their clients leave together.
    Every place is free within a tenth of a second (a waiter that only polled took up to 0.25 s)."""
    model = "echo"
    with httpx.Client(base_url=app.base_url, timeout=30) as http:

        def admitted() -> int:
            return http.get("/api/health").json()["queue"]["admitted"]

        held = sent(app, chat_body(model, content="FAULT", max_tokens=50, stream=True))
        try:
            wait_for(lambda: http.get("/api/health").json()["queue"]["generating"], "the held generation")
            waiting = [
                sent(app, chat_body(model, content=f"queued {i}", max_tokens=5, stream=bool(i % 2)))
                for i in range(DROPPED)
            ]
            wait_for(lambda: admitted() == DROPPED + 1, "every request to be admitted")
            left = time.perf_counter()
            for sock in waiting:
                sock.close()
            wait_for(lambda: admitted() == 1, "the places to be freed", timeout=10)
            freed = time.perf_counter() - left
            report = http.get("/api/health/inference").json()
            assert report["waiting"] == 0 and report["admitted"] == 1  # only the held one
        finally:
            held.close()
        wait_for(lambda: admitted() == 0, "the held one to be cancelled too")
        print(f"{DROPPED} queued requests whose clients left: places free {freed * 1000:.0f} ms after")
        assert freed < 0.1, f"places freed {freed * 1000:.0f} ms after the clients left"
        answer = http.post("/v1/chat/completions", json=chat_body(model, max_tokens=3))
        assert answer.status_code == 200, answer.text
