"""Importing definitions: verbatim storage, name conflicts, digests, refusals that store nothing."""

from __future__ import annotations

import copy
import json

import pytest

from millm_host.testing import assert_error


def probe_count(api) -> int:
    return len(api.get("/api/probes").json()["data"])


def test_import_stores_the_document_verbatim(api, lab, identity, helpers):
    doc = lab.definition(identity, name="verbatim")
    doc["x_unknown_top_level"] = {"kept": [1, 2.50, "é"]}  # unknown keys are kept, never used
    raw = json.dumps(doc, indent=3, ensure_ascii=False).encode("utf-8")
    response = api.post("/api/probes/import", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 201, response.text
    probe = response.json()
    assert probe["id"].startswith("pr_") and len(probe["id"]) == 15
    assert probe["rung"] == 2 and probe["rung_language"] == "detects on unseen tasks"
    assert probe["detector_digest"] == doc["identity"]["detector_digest"]
    assert probe["detector_digest_source"] == "producer"
    assert probe["armed"] is False
    exported = api.get(f"/api/probes/{probe['id']}/definition")
    assert exported.status_code == 200
    assert exported.content == raw  # the same bytes, so the same JSON
    assert api.get(f"/api/probes/{probe['id']}").json()["parity"] == {"status": "never_run"}


def test_name_conflict_fails_or_renames(api, lab, identity, helpers):
    doc = lab.definition(identity, name="conflicted")
    first = helpers.import_probe(api, doc)
    assert_error(api.post("/api/probes/import", json=doc), 409, "PROBE_NAME_CONFLICT")
    bad = api.post("/api/probes/import", json=doc, params={"on_conflict": "replace"})
    assert_error(bad, 400, "invalid_parameter", "on_conflict")
    renamed = helpers.import_probe(api, doc, on_conflict="rename")
    assert renamed["name"] == "conflicted (2)" and renamed["id"] != first["id"]


def test_digest_mismatch_is_refused_naming_field_and_values(api, lab, identity):
    doc = lab.definition(identity, name="tampered")
    stated = doc["identity"]["detector_digest"]
    doc["head"]["bias"] += 1.0  # the detector changed after its digest was taken
    before = probe_count(api)
    error = assert_error(
        api.post("/api/probes/import", json=doc), 409, "PROBE_IDENTITY_MISMATCH", "identity.detector_digest"
    )
    assert stated in error["message"]
    [mismatch] = error["mismatches"]
    assert mismatch["stated"] == stated and mismatch["computed"].startswith("sha256:")
    assert mismatch["computed"] != stated
    assert probe_count(api) == before


def test_decision_digest_is_checked_too(api, lab, identity):
    doc = lab.definition(identity, name="moved-bar")
    doc["decision"]["threshold"] = 5.0
    assert_error(api.post("/api/probes/import", json=doc), 409, "PROBE_IDENTITY_MISMATCH", "identity.decision_digest")


def test_unknown_identity_algorithm(api, lab, identity):
    doc = lab.definition(identity, name="future")
    doc["identity"]["algorithm"] = "mi.probe.identity/v9"
    before = probe_count(api)
    assert_error(api.post("/api/probes/import", json=doc), 409, "PROBE_IDENTITY_ALGORITHM_UNKNOWN")
    assert probe_count(api) == before


def test_a_definition_without_digests_gets_computed_ones(api, lab, identity, helpers):
    doc = lab.definition(identity, name="undigested", digests=False)
    probe = helpers.import_probe(api, doc)
    assert probe["detector_digest_source"] == "computed"
    assert probe["detector_digest"] == helpers.with_digests(doc)["identity"]["detector_digest"]


def test_invalid_definitions_name_the_field(api, lab, identity):
    base = lab.definition(identity, name="invalid", digests=False)
    cases = {
        "format": lambda d: d.update(format="mi.probe.definition/v2"),
        "head.weights": lambda d: d["head"].update(weights=d["head"]["weights"][:-1]),
        "read.layer": lambda d: d["read"].update(layer=99),
        "read.hook_point": lambda d: d["read"].update(hook_point="attn_out"),
        "aggregation.params.k": lambda d: d["aggregation"].update(rule="topk_mean", params={}),
        "head.attention_query": lambda d: d["aggregation"].update(rule="attention"),
        "evidence.rung": lambda d: d["evidence"].update(rung=4),
        "head.norm_std": lambda d: d["head"].update(norm_std=[0.0] * len(d["head"]["weights"])),
        "decision.windows[0]": lambda d: d["decision"].update(windows=["everything"]),
        "head.bias": lambda d: d["head"].update(bias=True),
        "head.surprise": lambda d: d["head"].update(surprise=1),
    }
    before = probe_count(api)
    for field, change in cases.items():
        doc = copy.deepcopy(base)
        change(doc)
        assert_error(api.post("/api/probes/import", json=doc), 400, "invalid_probe_definition", field)
    assert (
        api.post("/api/probes/import", content=b"[1, 2]", headers={"content-type": "application/json"}).status_code
        == 400
    )
    assert api.post("/api/probes/import", content=b"{", headers={"content-type": "application/json"}).status_code == 400
    assert probe_count(api) == before


def test_list_get_and_delete(api, lab, identity, helpers):
    probe = helpers.import_probe(api, lab.definition(identity, name="listed", behaviour="stakes"))
    listed = {p["id"]: p for p in api.get("/api/probes").json()["data"]}
    assert listed[probe["id"]]["behaviour"] == "stakes"
    detail = api.get(f"/api/probes/{probe['id']}").json()
    assert detail["acknowledgements"] == [] and detail["recalibrations"] == []
    assert api.get("/api/probes/pr_000000000000").status_code == 404
    assert api.delete(f"/api/probes/{probe['id']}").json()["deleted"] is True
    assert api.get(f"/api/probes/{probe['id']}").status_code == 404
    assert api.get(f"/api/probes/{probe['id']}/definition").status_code == 404


def test_delete_is_refused_while_armed(api, lab, identity, helpers):
    probe = helpers.import_probe(api, lab.definition(identity, name="armed-delete"))
    helpers.arm(api, probe["id"])
    assert_error(api.delete(f"/api/probes/{probe['id']}"), 409, "PROBE_ARMED")
    api.post(f"/api/probes/{probe['id']}/disarm")
    assert api.delete(f"/api/probes/{probe['id']}").status_code == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "zero\u200bwidth"),
        ("name", "bidi\u202eevil"),
        ("name", "bell\x07"),
        ("behaviour", "isolate\u2066x"),
        ("behaviour", "c1\x85"),
    ],
)
def test_names_with_hidden_characters_are_refused(api, lab, identity, field, value):
    doc = lab.definition(identity, name="hidden-characters", vectors=0, behaviour="shouting")
    doc[field] = value
    before = probe_count(api)
    response = api.post("/api/probes/import", json=doc)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_parameter", field) and "U+" in error["message"]
    assert probe_count(api) == before


@pytest.mark.parametrize("sae_id", ["../saes/x", "/tmp/saes/x", "..", "a/b", "a\\b", "zero\u200bwidth"])
def test_an_sae_id_must_name_one_directory_of_the_sae_dir(api, lab, identity, sae_id):
    doc = lab.definition(identity, name="escaping-sae", vectors=0, sae={"sae_id": sae_id, "feature_indices": [1, 2]})
    before = probe_count(api)
    response = api.post("/api/probes/import", json=doc)
    assert response.status_code == 400, response.text
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == ("invalid_parameter", "sae.sae_id")
    assert probe_count(api) == before


def test_a_plain_unicode_name_is_accepted(api, lab, identity, helpers):
    doc = lab.definition(identity, name="détecteur", vectors=0, behaviour="crier fort")
    assert helpers.import_probe(api, doc)["name"] == "détecteur"
