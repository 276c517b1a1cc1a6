"""A request whose client has gone costs nothing more: it leaves the queue at once (issue 35 §2).

On the echo engine (serial, its text on the engine thread) with the fault-injection
plugin: a FAULT stream holds the engine thread at its 2nd token, so the requests
behind it wait to be tokenized there. When their clients leave, their places are
freed the moment the server hears of it, not at the waiters' next poll (``TICK``,
a quarter of a second): a drop storm must not fill the queue with the gone. The same
holds for requests that wait for their model to load.
"""

from __future__ import annotations

import time

import httpx
import pytest

from millm_host.api import hookimpl
from millm_host.testing import chat_body
from millm_host.testing.helpers import sent_raw
from millm_host.testing.replicas import wait_until

BLOCK_S = 120  # a FAULT request holds the engine thread this long unless cancelled
DROPPED = 12


@pytest.fixture(scope="module")
def app(app_factory):
    return app_factory(plugins=["fault_injection"], env={"FAULT_INJECTION": f"slow:2:{BLOCK_S}"})


def test_queued_requests_whose_clients_leave_free_their_places_at_once(app):
    """Twelve requests, streamed or not, wait behind a held generation; their clients leave together.
    Every place is free within a tenth of a second (a waiter that only polled took up to 0.25 s)."""
    model = "echo"
    with httpx.Client(base_url=app.base_url, timeout=30) as http:

        def admitted() -> int:
            return http.get("/api/health").json()["queue"]["admitted"]

        held = sent_raw(
            app.base_url, "/v1/chat/completions", chat_body(model, content="FAULT", max_tokens=50, stream=True)
        )
        try:
            wait_until(
                lambda: http.get("/api/health").json()["queue"]["generating"], "the held generation", interval=0.005
            )
            waiting = [
                sent_raw(
                    app.base_url,
                    "/v1/chat/completions",
                    chat_body(model, content=f"queued {i}", max_tokens=5, stream=bool(i % 2)),
                )
                for i in range(DROPPED)
            ]
            wait_until(lambda: admitted() == DROPPED + 1, "every request to be admitted", interval=0.005)
            left = time.perf_counter()
            for sock in waiting:
                sock.close()
            wait_until(lambda: admitted() == 1, "the places to be freed", timeout=10, interval=0.005)
            freed = time.perf_counter() - left
            report = http.get("/api/health/inference").json()
            assert report["waiting"] == 0 and report["admitted"] == 1  # only the held one
        finally:
            held.close()
        wait_until(lambda: admitted() == 0, "the held one to be cancelled too", interval=0.005)
        print(f"{DROPPED} queued requests whose clients left: places free {freed * 1000:.0f} ms after")
        assert freed < 0.1, f"places freed {freed * 1000:.0f} ms after the clients left"
        answer = http.post("/v1/chat/completions", json=chat_body(model, max_tokens=3))
        assert answer.status_code == 200, answer.text


class Tokenized:
    """Counts the requests that got as far as tokenizing (a plugin registered on the app)."""

    def __init__(self) -> None:
        self.contents: list[str] = []

    @hookimpl
    def before_tokenize(self, ctx) -> None:
        self.contents += [m.get("content") or "" for conv in ctx.conversations for m in conv]


def test_requests_waiting_for_a_load_leave_when_their_clients_do(app_factory):
    """Four requests, streamed or not, wait for ``echo-b`` to load (the first of them asked for it); their
    clients leave while it loads. Their places are free at once, the load goes on, and none of them is
    ever tokenized or generated once the model is in (before, each waited out the load and then ran)."""
    seen = Tokenized()
    app = app_factory(
        plugins=["fault_injection"],
        models={"echo": {}, "echo-b": {}},
        env={"FAULT_INJECTION_LOAD_DELAY_S": "3", "FAULT_INJECTION_LOAD_DELAY_MODELS": "echo-b"},
        register=[seen],
    )
    with httpx.Client(base_url=app.base_url, timeout=30) as http:

        def health() -> dict:
            return http.get("/api/health").json()

        waiting = [
            sent_raw(
                app.base_url,
                "/v1/chat/completions",
                chat_body("echo-b", content=f"waiting {i}", max_tokens=5, stream=bool(i % 2)),
            )
            for i in range(4)
        ]
        wait_until(
            lambda: health()["status"] == "loading" and health()["queue"]["admitted"] == 4,
            "the load, and every request waiting for it",
            timeout=10,
            interval=0.005,
        )
        left = time.perf_counter()
        for sock in waiting:
            sock.close()
        wait_until(lambda: health()["queue"]["admitted"] == 0, "the places to be freed", timeout=10, interval=0.005)
        freed = time.perf_counter() - left
        assert health()["status"] == "loading"  # they left during the load, which goes on
        print(f"4 requests waiting for a load whose clients left: places free {freed * 1000:.0f} ms after")
        assert freed < 0.1, f"places freed {freed * 1000:.0f} ms after the clients left"
        wait_until(lambda: health()["status"] == "ok", "the load to finish", timeout=30, interval=0.05)
        assert health()["model"] == "echo-b"
        answer = http.post("/v1/chat/completions", json=chat_body("echo-b", content="after", max_tokens=3))
        assert answer.status_code == 200, answer.text
    assert seen.contents == ["after"], seen.contents  # none of the four ever ran
