"""Arming: the gates in order (limit, identity, evidence, parity, scope), each refusal naming its gate."""

from __future__ import annotations

import copy

from millm_host.testing import assert_error


def refusal(api, probe_id: str, code: str, **body) -> dict:
    """Arming refused (409) with ``code``; the error."""
    return assert_error(api.post(f"/api/probes/{probe_id}/arm", json=body), 409, code)


def armed_ids(api) -> set[str]:
    return {p["probe_id"] for p in api.get("/api/probes/status").json()["armed"]}


def test_parity_passes_for_a_probe_built_on_the_model(api, lab, identity, helpers):
    probe = helpers.import_probe(api, lab.definition(identity, name="parity-ok", rule="max", skip_prefix=True))
    report = api.post(f"/api/probes/{probe['id']}/parity").json()
    assert report["status"] == "passed"
    assert report["model"]["load_id"] == identity["load_id"]
    # Checked as it is served: alone, and in the continuous batch beside a longer and a shorter row.
    assert report["shapes_checked"] == ["alone", "continuous_batch"] and report["shapes_not_checked"] == {}
    for vector in report["vectors"]:
        assert vector["passed"] and vector["difference"] <= 1e-4
        batched = vector["shapes"]["continuous_batch"]
        assert batched["passed"] and batched["difference"] <= 1e-4, batched
        assert batched["batch_rows"] == 3 and batched["decoded"] == min(8, vector["n_tokens"] - 1)
        assert abs(batched["score"] - vector["score"]) <= 1e-4
        assert vector["per_token"]["compared"] == vector["n_tokens"]
        assert vector["per_token"]["max_abs_divergence"] < 1e-4
        assert vector["tokenization_drift"]["reproduces"] is True
    assert probe["id"] not in armed_ids(api)  # checking never arms
    assert api.get(f"/api/probes/{probe['id']}").json()["parity"]["status"] == "passed"
    assert api.get(f"/api/probes/{probe['id']}/parity").json()["data"][0]["report_id"] == report["report_id"]


def test_parity_fails_for_a_probe_recorded_on_the_wrong_layer(api, lab, identity, helpers):
    doc = lab.definition(identity, name="wrong-layer", layer=1, vector_layer=2)
    probe = helpers.import_probe(api, doc)
    report = api.post(f"/api/probes/{probe['id']}/parity").json()
    assert report["status"] == "failed"
    assert all(not v["passed"] and v["difference"] > 1e-3 for v in report["vectors"])
    error = refusal(api, probe["id"], "PROBE_PARITY_FAILED")
    assert error["gate"] == "parity"
    assert probe["id"] not in armed_ids(api)


def test_tokenization_drift_is_reported_and_never_gates(api, lab, identity, helpers):
    doc = lab.definition(identity, name="drifting", digests=False)
    doc["test_vectors"][0]["messages"] = [{"role": "user", "content": "something else entirely"}]
    probe = helpers.import_probe(api, doc)
    report = api.post(f"/api/probes/{probe['id']}/parity").json()
    assert report["status"] == "passed"
    drift = report["vectors"][0]["tokenization_drift"]
    assert drift["reproduces"] is False and drift["first_difference"] is not None


def test_identity_gate_names_every_mismatch(api, lab, identity, helpers):
    other = dict(identity, hf_id="someone/else", n_layers=identity["n_layers"] + 2, chat_template_sha256="0" * 64)
    probe = helpers.import_probe(api, lab.definition(other, name="other-model"))
    error = refusal(api, probe["id"], "PROBE_MODEL_MISMATCH")
    assert error["gate"] == "identity"
    fields = {m["field"]: m for m in error["mismatches"]}
    assert set(fields) == {"model.hf_id", "model.n_layers", "model.chat_template_sha256"}
    assert fields["model.hf_id"] == {"field": "model.hf_id", "probe": "someone/else", "model": identity["hf_id"]}
    assert "someone/else" in error["message"] and identity["hf_id"] in error["message"]


def test_an_unknown_revision_warns(api, lab, identity, helpers):
    doc = lab.definition(dict(identity, revision="0123abcd"), name="revisioned")
    probe = helpers.import_probe(api, doc)
    armed = helpers.arm(api, probe["id"])  # the server does not know its revision: a warning, not a refusal
    assert armed["armed"] is True
    assert any(w.startswith("revision_unknown") for w in armed["warnings"])


def test_evidence_gate_needs_an_acknowledgement_below_rung_2(api, lab, identity, helpers):
    doc = lab.definition(identity, name="weak", rung=1, digests=False)
    doc["evidence"]["acknowledgement"] = "exported for a demo"
    probe = helpers.import_probe(api, doc)
    error = refusal(api, probe["id"], "PROBE_ACKNOWLEDGEMENT_REQUIRED")
    assert error["gate"] == "evidence"
    assert refusal(api, probe["id"], "PROBE_ACKNOWLEDGEMENT_REQUIRED", acknowledgement="   ")["gate"] == "evidence"
    bad = api.post(f"/api/probes/{probe['id']}/arm", json={"acknowledgement": "ok", "force": True})
    assert_error(bad, 400, "invalid_parameter", "force")
    armed = helpers.arm(api, probe["id"], acknowledgement="triage only; reviewed by the on-call")
    assert armed["armed"] is True
    detail = api.get(f"/api/probes/{probe['id']}").json()
    assert detail["exporter_acknowledgement"] == "exported for a demo"  # the definition's, kept apart
    [ack] = detail["acknowledgements"]
    assert ack["text"] == "triage only; reviewed by the on-call" and ack["rung"] == 1
    assert ack["model_load_id"] == identity["load_id"]


def test_scope_gate_refuses_what_parity_cannot_verify(api, lab, identity, helpers):
    probe = helpers.import_probe(api, lab.definition(identity, name="prompt-scoped", scope="prompt"))
    report = api.post(f"/api/probes/{probe['id']}/parity").json()
    assert report["status"] == "cannot_check"
    error = refusal(api, probe["id"], "PROBE_SCOPE_UNVERIFIABLE")
    assert error["gate"] == "scope"


def test_a_probe_with_no_test_vectors_fails_parity(api, lab, identity, helpers):
    probe = helpers.import_probe(api, lab.definition(identity, name="unvectored", vectors=0))
    assert refusal(api, probe["id"], "PROBE_PARITY_FAILED")["gate"] == "parity"


def test_gates_run_in_order(api, lab, identity, helpers):
    other = dict(identity, d_model=identity["d_model"])
    other["hf_id"] = "someone/else"
    weak_wrong = helpers.import_probe(api, lab.definition(other, name="weak-wrong", rung=0, vector_layer=2))
    assert (
        refusal(api, weak_wrong["id"], "PROBE_MODEL_MISMATCH")["gate"] == "identity"
    )  # identity before evidence and parity
    weak_unequal = helpers.import_probe(api, lab.definition(identity, name="weak-unequal", rung=0, vector_layer=2))
    assert (
        refusal(api, weak_unequal["id"], "PROBE_ACKNOWLEDGEMENT_REQUIRED")["gate"] == "evidence"
    )  # evidence before parity


def test_disarm_and_rearm(api, lab, identity, helpers):
    probe = helpers.import_probe(api, lab.definition(identity, name="toggle"))
    assert helpers.arm(api, probe["id"])["armed"] is True
    assert helpers.arm(api, probe["id"])["armed"] is True  # arming twice is harmless
    disarmed = api.post(f"/api/probes/{probe['id']}/disarm").json()
    assert disarmed["armed"] is False and disarmed["disarmed_reason"] == "disarmed"
    assert probe["id"] not in armed_ids(api)


def test_recalibrate_moves_the_bar_only(api, lab, identity, helpers):
    doc = lab.definition(identity, name="recut")
    probe = helpers.import_probe(api, doc)
    helpers.arm(api, probe["id"])
    cut = {
        "provenance": {"probe_id": "prb_recut"},
        "decision": {
            "threshold": 1.25,
            "target_fpr": 0.05,
            "threshold_source": "traffic-2026-11",
            "windows": ["all", "prompt"],
        },
    }
    cut_digest = helpers.canonical_digest(cut["decision"])
    moved = api.post(f"/api/probes/{probe['id']}/recalibrate", json={**cut, "decision_digest": cut_digest})
    assert moved.status_code == 200, moved.text
    moved = moved.json()
    assert moved["decision"]["threshold"] == 1.25 and moved["windows"] == ["all", "prompt"]
    assert (moved["decision_revision"], moved["threshold_revision"]) == (2, 2)
    assert moved["decision_digest"] == cut_digest and moved["detector_digest"] == probe["detector_digest"]
    assert moved["armed"] is True
    assert api.get(f"/api/probes/{probe['id']}/definition").json() == doc  # the definition never changes
    [record] = api.get(f"/api/probes/{probe['id']}").json()["recalibrations"]
    assert record["previous"] == doc["decision"] and record["decision"] == cut["decision"]

    def refused(body, status, code, param=...):
        assert_error(api.post(f"/api/probes/{probe['id']}/recalibrate", json=body), status, code, param)

    detector = copy.deepcopy(cut)
    detector["head"] = doc["head"]
    refused(detector, 400, "invalid_parameter", "head")  # a cut cannot carry a detector
    inner = copy.deepcopy(cut)
    inner["decision"]["read"] = {"layer": 2}
    refused(inner, 400, "invalid_parameter", "decision.read")
    refused({**cut, "provenance": {"probe_id": "prb_someone_else"}}, 409, "PROBE_PROVENANCE_MISMATCH")
    refused(
        {"provenance": {"probe_id": "prb_recut"}, "decision": {"threshold": 2.0}},
        400,
        "PROBE_THRESHOLD_UNSOURCED",
        "decision.threshold",
    )
    refused({**cut, "decision_digest": "sha256:" + "0" * 64}, 409, "PROBE_IDENTITY_MISMATCH", "decision_digest")
    assert api.get(f"/api/probes/{probe['id']}").json()["decision_revision"] == 2


def test_a_definition_cannot_loosen_parity(api, lab, identity, helpers):
    """Issue 11 §4: tolerance 1e9 and scores 50 off passed parity and armed; the spec's bar is 1e-3."""
    doc = lab.definition(identity, name="loose")
    doc["parity"]["tolerance"] = 1e9
    for vector in doc["test_vectors"]:
        vector["score"] += 50.0
    probe = helpers.import_probe(api, doc)
    report = api.post(f"/api/probes/{probe['id']}/parity").json()
    assert report["status"] == "failed" and not any(v["passed"] for v in report["vectors"])
    assert (report["tolerance"], report["definition_tolerance"]) == (1e-3, 1e9)
    assert "tolerance 0.001" in report["reason"]
    assert api.get(f"/api/probes/{probe['id']}").json()["parity_tolerance"] == 1e-3
    error = refusal(api, probe["id"], "PROBE_PARITY_FAILED")
    assert error["gate"] == "parity"
    assert probe["id"] not in armed_ids(api)


def test_a_definition_may_tighten_parity(api, lab, identity, helpers):
    doc = lab.definition(identity, name="tight")
    doc["parity"]["tolerance"] = 1e-12
    for vector in doc["test_vectors"]:
        vector["score"] += 1e-4  # within the spec's 1e-3, outside the definition's own bar
    probe = helpers.import_probe(api, doc)
    report = api.post(f"/api/probes/{probe['id']}/parity").json()
    assert report["status"] == "failed" and report["tolerance"] == 1e-12
    assert refusal(api, probe["id"], "PROBE_PARITY_FAILED")["gate"] == "parity"
