"""A server of its own: a model with a known revision, unloads, restarts, a model change mid-request.

The model is the test model copied into a HuggingFace-cache-shaped path, so the
server knows its repository id and revision.
"""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from millm_host.api import parse_list
from millm_host.testing import assert_error

REVISION = "0123456789abcdef0123456789abcdef01234567"
CHAT = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def server(server_factory, probe_model_dir, tmp_path_factory):
    snapshot = tmp_path_factory.mktemp("hf") / "models--tests--probe-llama" / "snapshots" / REVISION
    shutil.copytree(probe_model_dir, snapshot)
    return server_factory(
        snapshot, env={"PROBE_VERDICT_HEADER_MAX_BYTES": "700", "FAULT_INJECTION": "token:4"}
    )  # fails only requests that say FAULT


@pytest.fixture
def http(server):
    with server.http() as client:
        yield client
        for probe in client.get("/api/probes").json()["data"]:
            client.post(f"/api/probes/{probe['id']}/disarm")
            client.delete(f"/api/probes/{probe['id']}")


def identity_of(http) -> dict:
    model_id = http.get("/api/health").json()["model"]
    return http.get(f"/api/models/{model_id}").json()


def test_the_model_reports_its_identity(http):
    identity = identity_of(http)
    assert identity["hf_id"] == "tests/probe-llama" and identity["revision"] == REVISION
    assert identity["d_model"] == 64 and identity["n_layers"] == 4
    assert len(identity["chat_template_sha256"]) == 64 and identity["load_id"]


def test_two_known_revisions_that_differ_refuse(http, lab, helpers):
    identity = identity_of(http)
    stale = helpers.import_probe(http, lab.definition(dict(identity, revision="f" * 40), name="stale"))
    error = assert_error(http.post(f"/api/probes/{stale['id']}/arm", json={}), 409, "PROBE_MODEL_MISMATCH")
    assert error["gate"] == "identity"
    assert error["mismatches"] == [{"field": "model.revision", "probe": "f" * 40, "model": REVISION}]
    current = helpers.import_probe(http, lab.definition(identity, name="current"))
    assert helpers.arm(http, current["id"])["warnings"] == []


def test_the_header_leaves_out_whole_behaviours_past_its_bound(http, lab, helpers):
    identity = identity_of(http)
    for i, behaviour in enumerate(["alpha", "beta", "gamma"]):
        doc = lab.definition(identity, name=f"b{i}", behaviour=behaviour, windows=["all", "prompt", "response"], seed=i)
        helpers.arm(http, helpers.import_probe(http, doc)["id"])
    response = http.post("/v1/chat/completions", json={"model": identity["id"], "messages": CHAT, "max_tokens": 3})
    value = response.headers["x-millm-probe-verdicts"]
    assert len(value) <= 700
    *kept, last = list(parse_list(value))
    assert last.value == "..." and last.params["truncated"] is True and last.params["total"] == 9
    behaviours = [m.params["behaviour"] for m in kept]
    # whole behaviours, in order (how many fit depends on each member's length: the set block's params count)
    whole = len(behaviours) // 3
    assert 1 <= whole < 3 and behaviours == [b for b in ["alpha", "beta", "gamma"][:whole] for _ in range(3)]
    assert len(response.json()["millm_probe_verdicts"]) == 9  # the body carries every result


def test_a_failed_generation_stores_interrupted_results(http, lab, helpers):
    identity = identity_of(http)
    probe = helpers.import_probe(http, lab.definition(identity, name="failing", windows=["all", "response"]))
    helpers.arm(http, probe["id"])
    trace = "6cf92f3577b34da6a3ce929d0e0e4736"
    response = http.post(
        "/v1/chat/completions",
        headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"},
        json={"model": identity["id"], "max_tokens": 20, "messages": [{"role": "user", "content": "FAULT here"}]},
    )
    assert response.status_code == 500
    events = {e["window"]: e for e in http.get("/api/probes/events", params={"trace_id": trace}).json()["data"]}
    assert {(e["outcome"], e["reason"]) for e in events.values()} == {("interrupted", "generation_error")}
    assert events["all"]["status"] == "partial" and events["all"]["n_scored_tokens"] > 0
    assert "verdict" not in events["all"] and events["response"]["status"] == "partial"


def test_an_unload_disarms_every_probe(http, lab, helpers):
    identity = identity_of(http)
    probe = helpers.import_probe(http, lab.definition(identity, name="unloaded"))
    helpers.arm(http, probe["id"])
    assert http.post(f"/api/models/{identity['id']}/unload").status_code == 200
    assert http.get("/api/probes/status").json()["armed"] == []
    assert http.post(f"/api/models/{identity['id']}/load").status_code == 200
    detail = http.get(f"/api/probes/{probe['id']}").json()
    assert detail["armed"] is False and detail["disarmed_reason"] == "model_unloaded"
    response = http.post("/v1/chat/completions", json={"model": identity["id"], "messages": CHAT, "max_tokens": 2})
    assert "x-millm-probe-verdicts" not in response.headers and "millm_probe_verdicts" not in response.json()


def test_a_model_change_mid_request_fails_the_remaining_inputs(http, server, lab, helpers):
    identity = identity_of(http)
    probe = helpers.import_probe(http, lab.definition(identity, name="changing"))
    inputs = [{"token_ids": [1] + [200 + (i * 7 + j) % 5000 for j in range(4000)]} for i in range(64)]
    outcome = {}

    def scoring():
        with server.http(timeout=300) as client:
            outcome["response"] = client.post("/api/probes/score", json={"probe_ids": [probe["id"]], "inputs": inputs})

    worker = threading.Thread(target=scoring)
    worker.start()
    deadline = time.monotonic() + 30
    while http.get("/api/health").json()["queue"]["admitted"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)  # until the scoring request holds a place in the queue
    time.sleep(0.3)  # past tokenizing, into the forward passes
    assert http.post(f"/api/models/{identity['id']}/unload").status_code == 200
    assert http.post(f"/api/models/{identity['id']}/load").status_code == 200
    worker.join(300)
    body = outcome["response"].json()
    assert "results" in body, body
    results = body["results"]
    scored = [r for r in results if "results" in r]
    changed = [r for r in results if "error" in r]
    assert scored and changed, "the model change did not land mid-request"
    assert all(r["error"]["code"] == "MODEL_CHANGED" for r in changed)
    assert max(r["index"] for r in scored) < min(r["index"] for r in changed)  # earlier results are kept
    assert {x["model_load_id"] for r in scored for x in r["results"]} == {identity["load_id"]}


def test_a_restart_disarms_every_probe(http, server, lab, helpers):
    identity = identity_of(http)
    probe = helpers.import_probe(http, lab.definition(identity, name="restarted"))
    helpers.arm(http, probe["id"])
    server.restart()
    with server.http() as client:
        assert client.get("/api/probes/status").json()["armed"] == []
        detail = client.get(f"/api/probes/{probe['id']}").json()
        assert detail["armed"] is False and detail["disarmed_reason"] == "restart"
        assert client.get(f"/api/probes/{probe['id']}/definition").status_code == 200  # definitions persist
