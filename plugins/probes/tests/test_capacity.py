"""A real server of its own (PROBE_MAX_ARMED 2): the per-model cost budget, the probe backstop on arming and
on stateless scoring, status, and behaviours named back after an unload and a restart."""

from __future__ import annotations

import pytest

from millm_host.testing import assert_error

CHAT = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def server(server_factory, probe_model_dir):
    # a warning threshold every request passes: the flag is seen raised
    return server_factory(probe_model_dir, env={"PROBE_MAX_ARMED": "2", "PROBE_OVERHEAD_WARN_MS": "0.0001"})


@pytest.fixture
def http(server):
    with server.http(timeout=300) as client:
        yield client
        for probe in client.get("/api/probes").json()["data"]:
            client.post(f"/api/probes/{probe['id']}/disarm")
            client.delete(f"/api/probes/{probe['id']}")
        model_id = client.get("/api/health").json()["model"]
        client.put(f"/api/models/{model_id}/probe-limits", json={"action": "clear"})


@pytest.fixture
def roomy_budget(http):
    """A generous override: what these tests check is not the cost gate, and a budget measured on a
    loaded machine (the first test measures one, kept for the module) could refuse their probes."""
    model_id = http.get("/api/health").json()["model"]
    roomy = {"action": "override", "ms_per_token": 1000.0, "ms_per_1k_prompt": 100_000.0}
    assert http.put(f"/api/models/{model_id}/probe-limits", json=roomy).status_code == 200


def identity_of(http) -> dict:
    return http.get(f"/api/models/{http.get('/api/health').json()['model']}").json()


def test_the_budget_falls_back_until_measured_then_measures(http, lab, helpers):
    identity = identity_of(http)
    model_id = identity["id"]
    before = http.get(f"/api/models/{model_id}/probe-capacity").json()
    assert before["measured"] is False and before["recommendation"] is None and before["stale"] is None
    assert before["fallback"] == {"per_token_ms": 0.25, "per_1k_prompt_ms": 0.5, "why": "not measured"}
    limits = before["limits"]
    assert limits["per_token_ms"]["source"] == "setting PROBE_MAX_OVERHEAD_MS_PER_PASS"
    assert limits["slowdown_budget_pct"] == {
        "value": 5.0,
        "source": "setting PROBE_SLOWDOWN_BUDGET_PCT",
        "set_by": None,
        "set_at": None,
    }
    assert limits["max_armed"]["value"] == 2 and before["budget"]["headroom"] == 0.9

    probe = helpers.import_probe(http, lab.definition(identity, name="busy"))
    helpers.arm(http, probe["id"])
    assert_error(http.post(f"/api/models/{model_id}/probe-capacity/measure"), 409, "PROBE_ARMED")
    http.post(f"/api/probes/{probe['id']}/disarm")
    assert http.post("/api/models/no-such-model/probe-capacity/measure").status_code == 404

    measured = http.post(f"/api/models/{model_id}/probe-capacity/measure")
    assert measured.status_code == 200, measured.text
    measured = measured.json()
    step = measured["measurement"]["step"]
    assert step["ms_per_token"] > 0 and step["ms_per_1k_prompt"] > 0
    assert {"hf_id", "precision", "device"} <= set(measured["measurement"]["identity"])
    assert set(measured["unit_costs"]["per_token"]) == {
        "layer",
        "mean",
        "max",
        "attention",
        "sparse",
        "request",
        "result",
    }
    assert measured["stale"] is False and measured["fallback"] is None
    assert measured["budget"]["per_token"]["source"] == "measured"
    budget_ms = measured["budget"]["per_token"]["budget_ms"]
    assert budget_ms == pytest.approx(0.05 * step["ms_per_token"])
    recommendation = measured["recommendation"]
    assert recommendation["dense_probes_fit"] >= 0 and "reference set" in recommendation["explanation"]

    wrong = {"action": "approve", "recommendation_digest": "sha256:" + "0" * 64}
    assert_error(http.put(f"/api/models/{model_id}/probe-limits", json=wrong), 409, "PROBE_RECOMMENDATION_CHANGED")
    approved = http.put(
        f"/api/models/{model_id}/probe-limits",
        json={"action": "approve", "recommendation_digest": recommendation["digest"], "set_by": "ops@example"},
    ).json()
    pct = approved["limits"]["slowdown_budget_pct"]
    assert pct["source"] == "approved" and pct["set_by"] == "ops@example" and pct["set_at"].endswith("Z")

    override = http.put(f"/api/models/{model_id}/probe-limits", json={"action": "override", "pct": 10.0}).json()
    assert override["budget"]["per_token"]["budget_ms"] == pytest.approx(2 * budget_ms)
    assert override["limits"]["slowdown_budget_pct"]["source"] == "override"
    tiny = http.put(f"/api/models/{model_id}/probe-limits", json={"action": "override", "ms_per_token": 1e-6}).json()
    assert tiny["limits"]["per_token_ms"]["source"] == "override"
    refusal = assert_error(http.post(f"/api/probes/{probe['id']}/arm", json={}), 409, "PROBE_COST_BUDGET_EXCEEDED")
    assert refusal["gate"] == "cost" and "the budget is measured" in refusal["message"]
    assert_error(
        http.put(f"/api/models/{model_id}/probe-limits", json={"action": "override"}),
        400,
        "invalid_parameter",
    )


def test_the_backstop_counts_a_set_and_a_score_request_without_probe_ids(http, roomy_budget, lab, helpers):
    identity = identity_of(http)
    for i in range(3):
        helpers.import_probe(http, lab.definition(identity, name=f"gannet-{i}", behaviour="gannet", seed=i))
    error = assert_error(http.post("/api/probes/behaviours/gannet/arm", json={}), 409, "PROBE_BEHAVIOUR_REFUSED")
    assert [g["gate"] for g in error["set_gates"]] == ["limit"]
    assert all(p["gate"] is None for p in error["probes"])  # each probe passed its own gates
    assert http.get("/api/probes/status").json()["armed"] == []
    scored = http.post("/api/probes/score", json={"inputs": [{"text": "a"}]})
    assert_error(scored, 400, "PROBE_MAX_ARMED", "probe_ids")  # today's loophole: no probe_ids, every probe
    ids = [p["id"] for p in http.get("/api/probes").json()["data"]]
    named = http.post("/api/probes/score", json={"probe_ids": ids, "inputs": [{"text": "a"}]})
    assert_error(named, 400, "PROBE_MAX_ARMED", "probe_ids")
    by_behaviour = http.post("/api/probes/score", json={"behaviours": ["gannet"], "inputs": [{"text": "a"}]})
    assert_error(by_behaviour, 400, "PROBE_MAX_ARMED", "behaviours")
    two = http.post("/api/probes/score", json={"probe_ids": ids[:2], "inputs": [{"text": "a"}]})
    assert two.status_code == 200, two.text


def test_status_tells_the_truth(http, roomy_budget, lab, helpers):
    identity = identity_of(http)
    probe = helpers.import_probe(http, lab.definition(identity, name="quiet", windows=["all", "response"]))
    helpers.arm(http, probe["id"])
    before = http.get("/api/probes/status").json()["armed"][0]
    assert before["quiet"] is True and before["quiet_reason"] == "no_requests_since_armed"
    batched = {"model": identity["id"], "messages": CHAT, "max_tokens": 2, "n": 2}
    judge = {"X-miLLM-Origin": "judge"}
    http.post("/v1/chat/completions", json=batched)
    http.post("/v1/chat/completions", json=batched)
    http.post("/v1/chat/completions", json={**batched, "n": 1}, headers=judge)
    status = http.get("/api/probes/status").json()
    assert status["force_serial"] is False and status["max_armed"] == 2  # probes score inside the batch
    [armed] = status["armed"]
    # the latest request was judge traffic, but over every window of the recent requests the probe is
    # quiet because its requests are batched: the reason is read over all of them, not the last window
    assert armed["quiet"] is True and armed["quiet_reason"] == "batched_request"
    assert armed["quiet_reasons"] == {"batched_request": 4, "judge_traffic": 2}
    assert armed["recent_requests"] == 3
    assert {r["window"] for r in armed["last_results"]} == {"all", "response"}
    assert armed["armed_at"].endswith("Z") and status["checked_at"].endswith("Z")
    assert all(r["recorded_at"].endswith("Z") for r in armed["last_results"])
    last = status["last_request"]
    assert last["recorded_at"].endswith("Z")
    assert last["threshold_ms"] == 0.0001 and last["threshold_exceeded"] is True  # skipped requests cost too
    assert status["overhead_warning_ms"] == 0.0001
    assert status["cost"]["probes"] == 1 and status["cost"]["basis"] in ("measured", "fallback")

    # once the probe scores, it is no longer quiet, and the overhead's parts are reported
    http.post("/v1/chat/completions", json={**batched, "n": 1})
    status = http.get("/api/probes/status").json()
    assert status["armed"][0]["quiet"] is False and status["armed"][0]["quiet_reason"] is None
    last = status["last_request"]
    assert last["overhead_ms"] == pytest.approx(last["request_ms"] + last["hooks_ms"], abs=0.01)
    assert last["hooked_points"] == 1 and last["device_to_host_copies"] == 1 and last["threshold_exceeded"] is True


def test_behaviours_that_were_armed_are_named_after_an_unload_and_a_restart(http, roomy_budget, server, lab, helpers):
    identity = identity_of(http)
    helpers.import_probe(http, lab.definition(identity, name="tern-a", behaviour="tern"))
    helpers.import_probe(http, lab.definition(identity, name="tern-b", behaviour="tern", layer=2, seed=1))
    assert http.post("/api/probes/behaviours/tern/arm", json={}).status_code == 200
    assert http.post(f"/api/models/{identity['id']}/unload").status_code == 200
    assert http.post(f"/api/models/{identity['id']}/load").status_code == 200
    listing = http.get("/api/probes/behaviours").json()
    assert listing["rearm"] == ["tern"]
    [tern] = listing["data"]
    assert tern["was_armed"] is True and tern["disarmed_reason"] == "model_unloaded" and tern["state"] == "disarmed"
    assert http.post("/api/probes/behaviours/tern/arm", json={}).json()["state"] == "armed"  # back in one call
    server.restart()
    with server.http() as client:
        listing = client.get("/api/probes/behaviours").json()
        assert listing["rearm"] == ["tern"] and listing["data"][0]["disarmed_reason"] == "restart"
