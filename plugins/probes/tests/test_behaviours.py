"""Behaviour sets (probe-monitors.txt, "Behaviour sets"): arm and disarm in one call, all or nothing,
partial sets, versions, the ``set`` block on every surface, and stateless scoring by behaviour."""

from __future__ import annotations

import json

from millm_host.api import parse_list
from millm_host.testing import assert_error

CHAT = [{"role": "user", "content": "Tell me about the harbour."}]


def behaviour(api, key: str) -> dict:
    [group] = [g for g in api.get("/api/probes/behaviours").json()["data"] if g["key"] == key]
    return group


def armed_ids(api) -> set[str]:
    return {p["probe_id"] for p in api.get("/api/probes/status").json()["armed"]}


def test_a_behaviour_arms_in_one_call_and_results_carry_its_set(api, lab, identity, model_id, helpers):
    a = helpers.import_probe(api, lab.definition(identity, name="harbour-a", behaviour="harbour", layer=1))
    b = helpers.import_probe(api, lab.definition(identity, name="harbour-b", behaviour="harbour", layer=2, seed=3))
    armed = api.post("/api/probes/behaviours/harbour/arm", json={})
    assert armed.status_code == 200, armed.text
    armed = armed.json()
    assert sorted(armed["armed_now"]) == sorted([a["id"], b["id"]]) and armed["state"] == "armed"
    assert {a["id"], b["id"]} <= armed_ids(api)

    response = api.post("/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 3})
    body = [r for r in response.json()["millm_probe_verdicts"] if r["behaviour"] == "harbour"]
    assert body and all(r["set"]["complete"] and r["set"]["total_members"] == 2 for r in body)
    digest = body[0]["set"]["members_digest"]
    members = [m for m in parse_list(response.headers["x-millm-probe-verdicts"]) if m.params["behaviour"] == "harbour"]
    assert all(m.params["set_total"] == 2 and m.params["complete"] is True for m in members)
    stored = api.get(f"/api/probes/events/{body[0]['result_id']}").json()
    assert stored["set"] == body[0]["set"]
    with api.stream(
        "POST", "/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 2, "stream": True}
    ) as stream:
        chunks = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: {")]
    [final] = [c for c in chunks if "millm_probe_verdicts" in c]
    assert all(r["set"]["complete"] for r in final["millm_probe_verdicts"] if r["behaviour"] == "harbour")

    # a probe imported later stays disarmed: the set is partial, and says which member is missing
    c = helpers.import_probe(api, lab.definition(identity, name="harbour-c", behaviour="harbour", layer=0, seed=4))
    group = behaviour(api, "harbour")
    assert group["state"].startswith("partial: 2 of 3 armed") and "harbour-c" in group["state"]
    assert group["missing_probe_ids"] == [c["id"]] and group["complete"] is False
    response = api.post("/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 2})
    partial = [r["set"] for r in response.json()["millm_probe_verdicts"] if r["behaviour"] == "harbour"]
    assert partial and all(
        s["armed_members"] == 2 and s["total_members"] == 3 and s["missing_probe_ids"] == [c["id"]] for s in partial
    )
    assert partial[0]["members_digest"] != digest
    again = api.post("/api/probes/behaviours/harbour/arm", json={}).json()
    assert again["armed_now"] == [c["id"]] and again["state"] == "armed"  # only the missing one


def test_disarm_keeps_a_hook_another_behaviour_uses(api, lab, identity, helpers):
    helpers.import_probe(api, lab.definition(identity, name="keel-a", behaviour="keel", layer=1))
    helpers.import_probe(api, lab.definition(identity, name="keel-b", behaviour="keel", layer=2, seed=2))
    mast = helpers.import_probe(api, lab.definition(identity, name="mast-a", behaviour="mast", layer=1, seed=6))
    for key in ("keel", "mast"):
        assert api.post(f"/api/probes/behaviours/{key}/arm", json={}).status_code == 200
    disarmed = api.post("/api/probes/behaviours/keel/disarm").json()
    assert disarmed["state"] == "disarmed" and len(disarmed["disarmed_now"]) == 2
    assert disarmed["hooks_kept"] == [{"layer": 1, "hook_point": "resid_post", "used_by": ["mast"]}]
    assert disarmed["hooks_removed"] == [{"layer": 2, "hook_point": "resid_post"}]
    assert armed_ids(api) == {mast["id"]}
    assert behaviour(api, "keel")["was_armed"] is False  # disarmed by a person: not offered back


def test_all_or_nothing_one_fails_parity_and_one_fails_cost(api, lab, identity, model_id, helpers):
    """A passes every gate; B fails parity; C (attention on another layer) does not fit the budget."""
    units = api.get(f"/api/models/{model_id}/probe-capacity").json()["unit_costs"]["per_token"]
    headroom = api.get(f"/api/models/{model_id}/probe-capacity").json()["budget"]["headroom"]
    room = (units["layer"] + units["mean"]) / headroom  # one dense probe on one layer, exactly
    put = api.put(f"/api/models/{model_id}/probe-limits", json={"action": "override", "ms_per_token": room * 1.001})
    assert put.status_code == 200, put.text
    try:
        a = helpers.import_probe(api, lab.definition(identity, name="reef-a", behaviour="reef", layer=1))
        b = helpers.import_probe(api, lab.definition(identity, name="reef-b", behaviour="reef", vector_layer=2))
        c = helpers.import_probe(
            api, lab.definition(identity, name="reef-c", behaviour="reef", layer=0, rule="attention", seed=9)
        )
        error = assert_error(api.post("/api/probes/behaviours/reef/arm", json={}), 409, "PROBE_BEHAVIOUR_REFUSED")
        gates = {p["probe_id"]: p["gate"] for p in error["probes"]}
        assert gates == {a["id"]: None, b["id"]: "parity", c["id"]: "cost"}
        assert {g["gate"] for g in error["set_gates"]} == {"cost"}
        [cost] = [p for p in error["probes"] if p["gate"] == "cost"]
        assert cost["code"] == "PROBE_COST_BUDGET_EXCEEDED" and "fallback" in cost["message"]
        assert "reef-b" in error["message"] and "reef-c" in error["message"]
        assert armed_ids(api).isdisjoint({a["id"], b["id"], c["id"]})  # nothing armed

        dry = api.post("/api/probes/behaviours/reef/arm", json={"dry_run": True}).json()
        assert dry["would_arm"] is False and {p["probe_id"]: p["gate"] for p in dry["probes"]} == gates
        projected = dry["projected_cost"]
        assert projected["fits"] is False and {"per_token", "per_1k_prompt"} <= set(projected)
        assert projected["per_token"]["source"] == "override" and projected["basis"] == "fallback"
        ok = api.post("/api/probes/behaviours/reef/arm", json={"dry_run": True, "probe_ids": [a["id"]]}).json()
        assert ok["would_arm"] is True and ok["probes"][0]["parity"]["status"] == "passed"
        assert a["id"] not in armed_ids(api)  # a dry run arms nothing
        single = assert_error(api.post(f"/api/probes/{c['id']}/arm", json={}), 409, "PROBE_COST_BUDGET_EXCEEDED")
        assert single["gate"] == "cost" and single["cost"]["basis"] == "fallback"
    finally:
        assert api.put(f"/api/models/{model_id}/probe-limits", json={"action": "clear"}).status_code == 200


def test_versions_are_named(api, lab, identity, helpers):
    one = helpers.import_probe(api, lab.definition(identity, name="tide-1", behaviour="tide"))
    doc = lab.definition(identity, name="tide-2", behaviour="tide", seed=8)
    doc["version"] = "2"
    two = helpers.import_probe(api, doc)
    error = assert_error(api.post("/api/probes/behaviours/tide/arm", json={}), 409, "PROBE_BEHAVIOUR_VERSION_AMBIGUOUS")
    assert error["versions"] == ["1", "2"]
    assert_error(
        api.post("/api/probes/behaviours/tide/arm", json={"version": "3"}), 400, "invalid_parameter", "version"
    )
    armed = api.post("/api/probes/behaviours/tide/arm", json={"version": "2"}).json()
    assert armed["armed_now"] == [two["id"]] and armed["total_members"] == 1 and armed["version"] == "2"
    assert one["id"] not in armed_ids(api)
    picked = api.post("/api/probes/behaviours/tide/arm", json={"probe_ids": [one["id"]]}).json()
    assert picked["armed_now"] == [one["id"]]
    assert_error(api.post("/api/probes/behaviours/nothing-here/arm", json={}), 404, "behaviour_not_found")


def test_score_accepts_behaviours(api, lab, identity, helpers):
    a = helpers.import_probe(api, lab.definition(identity, name="gull-a", behaviour="gull"))
    b = helpers.import_probe(api, lab.definition(identity, name="gull-b", behaviour="gull", layer=2, seed=2))
    scored = api.post("/api/probes/score", json={"behaviours": ["gull"], "inputs": [{"text": "gulls"}]})
    assert scored.status_code == 200, scored.text
    results = scored.json()["results"][0]["results"]
    assert {r["probe_id"] for r in results} == {a["id"], b["id"]}  # not armed, still scored
    assert all(r["set"]["complete"] and r["set"]["total_members"] == 2 for r in results)
    one = api.post("/api/probes/score", json={"probe_ids": [a["id"]], "inputs": [{"text": "gulls"}]}).json()
    [block] = {json.dumps(r["set"]) for r in one["results"][0]["results"]}
    assert json.loads(block)["missing_probe_ids"] == [b["id"]]
    assert_error(
        api.post("/api/probes/score", json={"behaviours": ["nope"], "inputs": [{"text": "x"}]}),
        404,
        "behaviour_not_found",
        "behaviours[0]",
    )
