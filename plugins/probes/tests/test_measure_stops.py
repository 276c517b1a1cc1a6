"""An app of its own: a probe-capacity measurement never holds the model hostage.

It stops between two of its runs when it is cancelled, when it passes ``PROBE_MEASURE_TIMEOUT_S``,
or when its model begins to unload; it answers 409 ``PROBE_CAPACITY_MEASURE_STOPPED`` and stores
nothing, and the unload finishes at once instead of after the whole measurement (issue 35: an
unload issued half a second after measure began took 9.5 minutes, every generation refused).
"""

from __future__ import annotations

import threading
import time

import pytest

from millm_host.testing import assert_error


@pytest.fixture(scope="module")
def server(probe_app):
    return probe_app(GRACEFUL_UNLOAD_TIMEOUT="120")


def start_measure(server, model_id: str) -> tuple[threading.Thread, dict]:
    """POST measure on a thread of its own; returns once the server says the measurement is in progress."""
    answer: dict = {}

    def run() -> None:
        with server.http(timeout=600) as http:
            answer["response"] = http.post(f"/api/models/{model_id}/probe-capacity/measure")

    thread = threading.Thread(target=run)
    thread.start()
    with server.http() as http:
        deadline = time.monotonic() + 60
        while not http.get(f"/api/models/{model_id}/probe-capacity").json()["measuring"]:
            assert time.monotonic() < deadline and thread.is_alive(), answer
            time.sleep(0.05)
    time.sleep(0.5)  # well inside its runs
    return thread, answer


def stopped(thread: threading.Thread, answer: dict, why: str) -> None:
    thread.join(timeout=60)
    assert not thread.is_alive()
    error = assert_error(answer["response"], 409, "PROBE_CAPACITY_MEASURE_STOPPED")
    assert why in error["message"] and "nothing was stored" in error["message"]


def test_a_cancelled_measurement_stops_and_stores_nothing(server):
    model_id = server.model_id
    with server.http() as http:
        assert_error(http.delete(f"/api/models/{model_id}/probe-capacity/measure"), 404, "PROBE_CAPACITY_NOT_MEASURING")
        thread, answer = start_measure(server, model_id)
        health = http.get("/api/health").json()  # serving goes on, and health says what runs
        assert health["status"] == "measuring" and "probe capacity" in health["reason"], health
        began = time.monotonic()
        cancel = http.delete(f"/api/models/{model_id}/probe-capacity/measure")
        assert cancel.status_code == 200 and cancel.json()["cancelled"] is True
        stopped(thread, answer, "cancelled")
        assert time.monotonic() - began < 10
        capacity = http.get(f"/api/models/{model_id}/probe-capacity").json()
        assert capacity["measured"] is False and capacity["measuring"] is False


def test_an_unload_stops_a_measurement_and_finishes_at_once(server):
    model_id = server.model_id
    thread, answer = start_measure(server, model_id)
    with server.http(timeout=120) as http:
        began = time.monotonic()
        unload = http.post(f"/api/models/{model_id}/unload")
        took = time.monotonic() - began
        assert unload.status_code == 200, unload.text
        stopped(thread, answer, "unload")
        assert took < 15, took  # one run of the measurement at most, not the rest of it (or the 120 s grace)
        assert http.get(f"/api/models/{model_id}").json()["state"] == "READY"
        assert http.post(f"/api/models/{model_id}/load").status_code == 200
        reply = http.post(
            "/v1/chat/completions",
            json={"model": model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        )
        assert reply.status_code == 200, reply.text


def test_a_measurement_past_its_time_bound_stops(probe_app):
    bounded = probe_app(PROBE_MEASURE_TIMEOUT_S="1")
    with bounded.http(timeout=120) as http:
        began = time.monotonic()
        response = http.post(f"/api/models/{bounded.model_id}/probe-capacity/measure")
        error = assert_error(response, 409, "PROBE_CAPACITY_MEASURE_STOPPED")
        assert "PROBE_MEASURE_TIMEOUT_S (1 s)" in error["message"] and time.monotonic() - began < 15
        assert http.get(f"/api/models/{bounded.model_id}/probe-capacity").json()["measured"] is False
