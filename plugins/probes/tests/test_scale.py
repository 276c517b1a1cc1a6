"""An app of its own (PROBE_MAX_ARMED 400): a behaviour of hundreds of probes arms in one call.

Parity for the set shares each distinct test vector's forward pass; a monitored request then reads
one layer hook per hooked point and makes one device-to-host copy, however many probes are armed.
"""

from __future__ import annotations

import pytest

from millm_probes.capacity import costs

COUNT = 300
CHAT = [{"role": "user", "content": "Count the gulls on the harbour wall."}]


@pytest.fixture(scope="module")
def server(probe_app):
    return probe_app(PROBE_MAX_ARMED="400")


@pytest.fixture(scope="module")
def http(server):
    with server.http(timeout=300) as client:
        model_id = client.get("/api/health").json()["model"]
        roomy = {"action": "override", "ms_per_token": 10_000.0, "ms_per_1k_prompt": 100_000.0}
        assert client.put(f"/api/models/{model_id}/probe-limits", json=roomy).status_code == 200
        yield client


def test_hundreds_of_probes_arm_in_one_call_and_read_one_hook_per_point(http, lab, helpers):
    model_id = http.get("/api/health").json()["model"]
    identity = http.get(f"/api/models/{model_id}").json()
    ids = [
        helpers.import_probe(
            http, lab.definition(identity, name=f"shoal-{i}", behaviour="shoal", layer=1 + i % 2, seed=i, vectors=1)
        )["id"]
        for i in range(COUNT)
    ]
    dry = http.post("/api/probes/behaviours/shoal/arm", json={"dry_run": True}).json()
    assert dry["would_arm"] is True and all(p["gate"] is None for p in dry["probes"])
    units = http.get(f"/api/models/{model_id}/probe-capacity").json()["unit_costs"]
    shape = costs.Shape(points=2, kinds=(("mean", COUNT),), results=COUNT)
    expected = costs.cost(units, shape)
    assert {h: dry["projected_cost"][h]["cost_ms"] for h in costs.HALVES} == {
        h: round(v, 6) for h, v in expected.items()
    }

    armed = http.post("/api/probes/behaviours/shoal/arm", json={})
    assert armed.status_code == 200, armed.text
    armed = armed.json()
    assert len(armed["armed_now"]) == COUNT and armed["state"] == "armed"
    # every probe's vector is the same chat: one forward pass scored all of them
    [report] = http.get(f"/api/probes/{ids[-1]}/parity").json()["data"][:1]
    assert report["status"] == "passed" and report["vectors"][0]["forward_shared_by"] == COUNT

    response = http.post("/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 3})
    results = response.json()["millm_probe_verdicts"]
    assert len(results) == COUNT and all(r["set"]["complete"] for r in results)
    last = http.get("/api/probes/status").json()["last_request"]
    assert last["hooked_points"] == 2 and last["device_to_host_copies"] == 1 and last["results"] == COUNT
    assert last["request_ms"] > 0 and last["hooks_prompt_ms"] <= last["hooks_ms"]
    assert len(response.headers["x-millm-probe-verdicts"]) <= 8192  # bounded, whole behaviours left out

    listing = [g for g in http.get("/api/probes/behaviours").json()["data"] if g["key"] == "shoal"]
    assert listing[0]["armed_members"] == COUNT and len(listing[0]["members"]) == COUNT
    disarmed = http.post("/api/probes/behaviours/shoal/disarm").json()
    assert len(disarmed["disarmed_now"]) == COUNT and disarmed["state"] == "disarmed"
    assert http.get("/api/probes/status").json()["armed"] == []
