"""Two ``millm serve`` replicas on one database: armed probes, steering and sessions are shared.

Replica A and B serve the same model (one HF-cache snapshot) and share one
database (a SQLite file, or PostgreSQL when ``MILLM_TEST_POSTGRES_URL`` is set).
An operator's change on A is desired state: B converges to it through its own
gates within its convergence interval; a replica whose gates refuse says why in
``/api/health`` and is not ready.
"""

from __future__ import annotations

import secrets
import shutil
import threading
from typing import Any

import pytest

from millm_host.testing import assert_error
from millm_host.testing.replicas import FAST_CONVERGE, shared_database_url, wait_until
from millm_saelens.testing import write_sae

pytestmark = pytest.mark.slow

REVISION = "1123456789abcdef0123456789abcdef01234567"
OTHER_REVISION = "2223456789abcdef0123456789abcdef01234567"
CHAT = [{"role": "user", "content": "Say something."}]


def snapshot(tmp_path_factory, probe_model_dir, revision: str):
    """The test model at an HF-cache path, so the server knows its revision (the identity gate reads it)."""
    path = tmp_path_factory.mktemp("hf") / "models--tests--probe-llama" / "snapshots" / revision
    shutil.copytree(probe_model_dir, path)
    return path


@pytest.fixture(scope="module")
def shared(tmp_path_factory, probe_model_dir) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("replicas")
    env = {
        "MILLM_DATABASE_URL": shared_database_url(root),
        "MILLM_SAE_DIRS": str(root / "saes"),
        **FAST_CONVERGE,
    }
    return {"root": root, "env": env, "model": snapshot(tmp_path_factory, probe_model_dir, REVISION)}


@pytest.fixture(scope="module")
def replicas(replicas_factory, shared):
    """A and B, started at once."""
    return replicas_factory(2, shared["model"], env=shared["env"])


@pytest.fixture(scope="module")
def a(replicas):
    return replicas[0]


@pytest.fixture(scope="module")
def b(replicas):
    return replicas[1]


@pytest.fixture
def clients(a, b):
    """Clients on A and B; every probe a test leaves is disarmed and deleted, and B has converged after."""
    with a.http() as ha, b.http() as hb:
        yield ha, hb
        for probe in ha.get("/api/probes").json()["data"]:
            ha.post(f"/api/probes/{probe['id']}/disarm")
            ha.delete(f"/api/probes/{probe['id']}")
        ha.delete("/api/steering")
        wait_until(lambda: converged(hb) and not armed(hb), "B to converge after the test")


def identity_of(http) -> dict[str, Any]:
    return http.get(f"/api/models/{http.get('/api/health').json()['model']}").json()


def converged(http) -> bool:
    return http.get("/api/health").json()["replica"]["converged"]


def armed(http) -> list[str]:
    return [p["probe_id"] for p in http.get("/api/probes/status").json()["armed"]]


def chat(http, messages=CHAT, **headers: str):
    model = http.get("/api/health").json()["model"]
    response = http.post(
        "/v1/chat/completions", headers=headers, json={"model": model, "messages": messages, "max_tokens": 3}
    )
    assert response.status_code == 200, response.text
    return response


def test_arming_on_one_replica_arms_the_other_and_disarming_disarms_it(clients, lab, helpers):
    ha, hb = clients
    probe = helpers.import_probe(ha, lab.definition(identity_of(ha), name="shared"))
    helpers.arm(ha, probe["id"])
    wait_until(lambda: hb.get(f"/api/probes/{probe['id']}").json()["armed"], "B to arm the probe")
    assert wait_until(lambda: converged(hb), "B to report convergence")
    assert hb.get("/api/health").json()["replica"]["reasons"] == []
    assert hb.get("/api/health/ready").status_code == 200
    assert len(chat(hb).json()["millm_probe_verdicts"]) == 1  # B monitors its own requests

    assert ha.post(f"/api/probes/{probe['id']}/disarm").status_code == 200
    wait_until(lambda: not hb.get(f"/api/probes/{probe['id']}").json()["armed"], "B to disarm the probe")
    assert "millm_probe_verdicts" not in chat(hb).json()


def test_a_replica_whose_gates_refuse_says_why_and_is_not_ready(
    clients, lab, helpers, server_factory, shared, tmp_path_factory, probe_model_dir
):
    ha, _ = clients
    other = snapshot(tmp_path_factory, probe_model_dir, OTHER_REVISION)  # the same weights at another revision
    c = server_factory(other, env=shared["env"])
    try:
        with c.http() as hc:
            probe = helpers.import_probe(ha, lab.definition(identity_of(ha), name="refused on c"))
            helpers.arm(ha, probe["id"])

            def refused() -> list[str]:
                reasons = hc.get("/api/health").json()["replica"]["reasons"]
                return [r for r in reasons if probe["id"] in r]

            reason = wait_until(refused, "C to report the refusal")[0]
            assert "PROBE_MODEL_MISMATCH" in reason and "refused here" in reason
            assert not converged(hc) and armed(hc) == []
            error = assert_error(hc.get("/api/health/ready"), 503, "not_ready")
            assert probe["id"] in error["message"]

            ha.post(f"/api/probes/{probe['id']}/disarm")
            wait_until(lambda: converged(hc), "C to converge once the probe is disarmed")
            assert hc.get("/api/health/ready").status_code == 200
    finally:
        c.stop()


def test_steering_on_one_replica_steers_the_other(clients, lab, shared):
    ha, hb = clients
    write_sae(shared["root"] / "saes" / "rep-sae", d_in=lab.d_model, d_sae=128, layer=1)
    registered = ha.post("/api/saes", json={"path": str(shared["root"] / "saes" / "rep-sae"), "sae_id": "rep-sae"})
    assert registered.status_code in (200, 201), registered.text
    assert ha.post("/api/saes/rep-sae/attach", json={}).status_code == 200
    steer = {"sae_id": "rep-sae", "features": [{"index": 3, "strength": 2.0}]}
    assert ha.put("/api/steering", json=steer).status_code == 200
    applied = ha.get("/api/steering").json()["applied"]
    assert applied and "rep-sae" in applied
    wait_until(lambda: hb.get("/api/steering").json()["applied"] == applied, "B to steer as A does")
    assert chat(hb).headers["x-millm-steering"] == chat(ha).headers["x-millm-steering"]

    assert ha.post("/api/steering/lock", json={}).status_code == 200  # the lock follows too
    wait_until(lambda: hb.get("/api/steering/lock").json()["locked"], "B to take the lock")
    assert ha.delete("/api/steering/lock").status_code == 200
    ha.delete("/api/steering")
    wait_until(lambda: not hb.get("/api/steering").json()["manual"], "B to clear its live values")
    wait_until(lambda: not hb.get("/api/steering/lock").json()["locked"], "B to drop the lock")
    assert "x-millm-steering" not in chat(hb).headers or "rep-sae" not in chat(hb).headers["x-millm-steering"]
    ha.post("/api/saes/rep-sae/detach", json={})
    wait_until(lambda: not hb.get("/api/steering").json()["attached"], "B to detach")


def test_a_conversation_continued_on_the_other_replica_joins_its_session(clients, lab, helpers):
    ha, hb = clients
    probe = helpers.import_probe(ha, lab.definition(identity_of(ha), name="sessions"))
    helpers.arm(ha, probe["id"])
    wait_until(lambda: armed(hb), "B to arm the probe")
    first = chat(ha)
    session = first.headers["x-millm-session-id"]
    reply = first.json()["choices"][0]["message"]["content"]
    second = chat(hb, [*CHAT, {"role": "assistant", "content": reply}, {"role": "user", "content": "More."}])
    assert second.headers["x-millm-session-id"] == session
    timeline = ha.get(f"/api/probes/sessions/{session}").json()
    assert timeline["turns"] == 2 and [t["turn"] for t in timeline["timeline"]] == [1, 2]


def test_concurrent_turns_on_both_replicas_lose_and_repeat_nothing(clients, lab, helpers, a, b):
    ha, hb = clients
    probe = helpers.import_probe(ha, lab.definition(identity_of(ha), name="concurrent"))
    helpers.arm(ha, probe["id"])
    wait_until(lambda: armed(hb), "B to arm the probe")
    session = "together-" + secrets.token_hex(4)
    per_client, traces, failures = 6, [], []

    def client(server) -> None:
        with server.http() as http:
            for _ in range(per_client):
                trace = secrets.token_hex(16)
                traces.append(trace)
                try:
                    chat(http, **{"X-miLLM-Session": session, "traceparent": f"00-{trace}-b7ad6b7169203331-01"})
                except AssertionError as exc:
                    failures.append(exc)

    threads = [threading.Thread(target=client, args=(server,)) for server in (a, a, b, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    total = per_client * len(threads)
    timeline = hb.get(f"/api/probes/sessions/{session}").json()
    assert timeline["turns"] == total
    assert sorted(t["turn"] for t in timeline["timeline"]) == list(range(1, total + 1))  # each number once
    assert sorted(t["trace_id"] for t in timeline["timeline"]) == sorted(traces)  # each request once
    events = ha.get("/api/probes/events", params={"probe_id": probe["id"], "limit": 500}).json()["data"]
    assert sorted(e["trace_id"] for e in events) == sorted(traces)  # one event per request, none lost
