"""An unload issued while parity or an arm runs (issue 35): it stops them, and never waits out the rest.

Parity checks a probe's test vectors one at a time, each on its own place in the queue.
Here each vector's check is held on the engine thread for ``VECTOR_S`` (the app is
in-process, served over real HTTP, so the test slows that one function down), so a
check of three vectors takes seconds. An unload issued during the first returns within
``GRACEFUL_UNLOAD_TIMEOUT``: it waits for the vector being checked, no more. Parity, or
the arm that runs it, stops there with 409 ``PROBE_PARITY_STOPPED`` naming the unload; no
report is stored and nothing is armed, in memory or in the database; ``/api/health``
says ``no_model``; loaded again, the model serves, and the same probe passes and arms.
Before, parity answered ``503 model_busy`` ("retry once it finishes") or, when the
unload had finished, stored a ``model_changed`` report.
"""

from __future__ import annotations

import threading
import time

import pytest

from millm_host.testing import assert_error
from millm_host.testing.replicas import wait_until

GRACE_S = 3.0
VECTOR_S = 0.3  # each vector's check, held on the engine thread


@pytest.fixture(scope="module")
def server(app_factory, probe_model_dir):
    """Every installed plugin on the transformers engine, in-process (the test reaches into parity)."""
    env = {"GRACEFUL_UNLOAD_TIMEOUT": str(GRACE_S)}
    return app_factory(plugins="all", checkpoint=probe_model_dir, env=env)


@pytest.fixture(scope="module")
def model_id(server) -> str:
    return server.model_id  # the resident model's (None once unloaded)


@pytest.fixture
def probe(server, model_id, lab, helpers, monkeypatch):
    """A probe with three test vectors, each held ``VECTOR_S`` while parity checks it."""
    from millm_probes.arming import parity

    check = parity._score_vectors

    def slowly(*args):
        time.sleep(VECTOR_S)
        return check(*args)

    monkeypatch.setattr(parity, "_score_vectors", slowly)
    with server.http() as http:
        identity = http.get(f"/api/models/{model_id}").json()
        probe = helpers.import_probe(http, lab.definition(identity, name="unload-race", vectors=3))
        yield probe
        http.post(f"/api/probes/{probe['id']}/disarm")
        http.delete(f"/api/probes/{probe['id']}")


def in_flight(server, path: str) -> tuple[threading.Thread, dict]:
    """POST ``path`` on a thread of its own; returns once its parity holds a place in the queue."""
    answer: dict = {}

    def run() -> None:
        with server.http(timeout=120) as http:
            answer["response"] = http.post(path, json={})

    thread = threading.Thread(target=run)
    thread.start()
    with server.http() as http:
        wait_until(
            lambda: http.get("/api/health").json()["queue"]["admitted"] or not thread.is_alive(),
            "parity to begin",
            timeout=60,
            interval=0.01,
        )
    assert thread.is_alive(), answer
    return thread, answer


def unload_during(server, model_id: str, thread: threading.Thread, answer: dict) -> None:
    """Unload now: it returns within the grace; the work in flight stops with ``PROBE_PARITY_STOPPED``."""
    with server.http(timeout=120) as http:
        began = time.monotonic()
        unload = http.post(f"/api/models/{model_id}/unload")
        took = time.monotonic() - began
        assert unload.status_code == 200, unload.text
        assert took < GRACE_S, f"the unload took {took:.1f} s"
        thread.join(timeout=60)
        assert not thread.is_alive()
        error = assert_error(answer["response"], 409, "PROBE_PARITY_STOPPED")
        assert "unload" in error["message"] and "nothing was stored" in error["message"], error
        health = http.get("/api/health").json()
        assert (health["status"], health["model"]) == ("no_model", None), health
        assert http.get(f"/api/models/{model_id}").json()["state"] == "READY"


def load_and_serve(server, model_id: str) -> None:
    with server.http(timeout=120) as http:
        assert http.post(f"/api/models/{model_id}/load").status_code == 200
        reply = http.post(
            "/v1/chat/completions",
            json={"model": model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        )
        assert reply.status_code == 200, reply.text
        wait_until(lambda: http.get("/api/health").json()["replica"]["converged"], "convergence after the load")


def test_an_unload_stops_parity(server, model_id, probe):
    thread, answer = in_flight(server, f"/api/probes/{probe['id']}/parity")
    unload_during(server, model_id, thread, answer)
    with server.http(timeout=120) as http:
        assert http.get(f"/api/probes/{probe['id']}/parity").json()["data"] == []  # nothing stored
        load_and_serve(server, model_id)
        report = http.post(f"/api/probes/{probe['id']}/parity")
        assert report.status_code == 200 and report.json()["status"] == "passed", report.text


def test_an_unload_stops_an_arm(server, model_id, probe):
    thread, answer = in_flight(server, f"/api/probes/{probe['id']}/arm")
    unload_during(server, model_id, thread, answer)
    with server.http(timeout=120) as http:
        assert http.get(f"/api/probes/{probe['id']}").json()["armed"] is False
        load_and_serve(server, model_id)  # convergence does not arm it either: it was never desired
        assert http.get(f"/api/probes/{probe['id']}").json()["armed"] is False
        armed = http.post(f"/api/probes/{probe['id']}/arm", json={})
        assert armed.status_code == 200 and armed.json()["armed"] is True, armed.text
