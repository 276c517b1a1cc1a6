"""Feature labels: Neuronpedia's export and SAELens' autointerp lines imported, searched, and shown beside
feature indices (profiles, clusters, circuits, live values, activations, the web UI); hostile files refused."""

from __future__ import annotations

import gzip
import json

import pytest

from millm_host.testing import assert_error
from millm_steering import labels as label_files

D_SAE = 256

#: What ``GET https://www.neuronpedia.org/api/explanation/export?modelId=…&saeId=…`` answers: flat
#: records, the index a string.
NEURONPEDIA = [
    {
        "modelId": "tiny",
        "layer": "0-res-test",
        "index": "12",
        "description": " references to cats and kittens",
        "typeName": "oai_token-act-pair",
        "explanationModelName": "gpt-4o-mini",
    },
    {
        "modelId": "tiny",
        "layer": "0-res-test",
        "index": "40",
        "description": "100% certainty phrases",
        "typeName": "np_max-act-logits",
        "explanationModelName": "gemini-2.0-flash",
    },
    {
        "modelId": "tiny",
        "layer": "0-res-test",
        "index": "7",
        "description": "Python function definitions",
        "typeName": "oai_token-act-pair",
        "explanationModelName": "gpt-4o-mini",
    },
]

#: What SAELens' ``autointerp_neuronpedia_features(save_to_disk=True)`` writes: JSON lines.
SAELENS = [
    {
        "modelId": "tiny",
        "layer": "0-res-test",
        "index": 40,
        "explanation": "Expressions of CERTAINTY",
        "explanationScore": 0.62,
        "explanationModel": "gpt-4-1106-preview",
        "activations": [{"id": "a", "tokens": ["I", " am", " sure"], "act_values": [0.0, 1.5, 3.0]}],
    },
    {"modelId": "tiny", "layer": "0-res-test", "index": 99, "explanation": "dog breeds", "explanationScore": 0.4},
]


def jsonl(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


@pytest.fixture
def sae(client, sae_dir) -> str:
    """A registered SAE that Neuronpedia knows as ``tiny/0-res-test`` (its cfg.json says so)."""
    path = sae_dir("labelled", d_sae=D_SAE, neuronpedia_id="tiny/0-res-test")
    client.post("/api/saes", json={"path": str(path), "sae_id": "labelled"}).raise_for_status()
    return "labelled"


@pytest.fixture
def files(sae_root):
    """Label files under ``MILLM_SAE_DIRS`` (where a path import may read)."""
    folder = sae_root / "label-files"
    folder.mkdir(exist_ok=True)
    (folder / "export.json").write_text(json.dumps(NEURONPEDIA), encoding="utf-8")
    (folder / "autointerp.jsonl").write_text(jsonl(SAELENS), encoding="utf-8")
    (folder / "export.json.gz").write_bytes(gzip.compress(json.dumps(NEURONPEDIA).encode()))
    (folder / "latin1.json").write_bytes('[{"index": 1, "description": "caf\xe9"}]'.encode("latin-1"))
    return folder


def labels_of(client, sae_id, **params):
    response = client.get(f"/api/saes/{sae_id}/labels", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_import_both_formats_search_and_reimport(client, sae, files):
    imported = client.post(f"/api/saes/{sae}/labels", json={"path": str(files / "export.json")})
    assert imported.status_code == 200, imported.text
    assert imported.json() == {
        "sae_id": sae,
        "mode": "replace",
        "imported": 3,
        "skipped_duplicates": 0,
        "formats": ["neuronpedia"],
        "source": "tiny/0-res-test",
        "labels": 3,
    }
    page = labels_of(client, sae)
    assert [(d["index"], d["label"]) for d in page["data"]] == [
        (7, "Python function definitions"),
        (12, "references to cats and kittens"),  # whitespace trimmed
        (40, "100% certainty phrases"),
    ]
    assert page["data"][1]["explainer"] == "gpt-4o-mini" and page["data"][1]["method"] == "oai_token-act-pair"
    assert page["first_id"] == 7 and page["last_id"] == 40 and page["has_more"] is False

    # SAELens' lines, uploaded, merged: feature 40 is relabelled, 99 added, the rest kept
    merged = client.post(f"/api/saes/{sae}/labels", json={"content": jsonl(SAELENS), "mode": "merge"}).json()
    assert merged["formats"] == ["saelens"] and merged["imported"] == 2 and merged["labels"] == 4
    one = client.get(f"/api/saes/{sae}/labels/40").json()
    assert one["label"] == "Expressions of CERTAINTY" and one["score"] == 0.62
    assert one["explainer"] == "gpt-4-1106-preview" and one["method"] is None
    again = client.post(f"/api/saes/{sae}/labels", json={"content": jsonl(SAELENS), "mode": "merge"}).json()
    assert again["labels"] == 4  # idempotent
    assert client.get(f"/api/saes/{sae}").json()["labels"] == 4

    # search: case-insensitive substring; % and _ are text, not patterns; paged
    assert [d["index"] for d in labels_of(client, sae, q="CERTAINTY")["data"]] == [40]
    assert [d["index"] for d in labels_of(client, sae, q="cats AND")["data"]] == [12]
    assert labels_of(client, sae, q="%")["data"] == []
    assert labels_of(client, sae, q="_")["data"] == []
    first = labels_of(client, sae, limit=2)
    assert [d["index"] for d in first["data"]] == [7, 12] and first["has_more"] is True
    rest = labels_of(client, sae, limit=2, after=first["last_id"])
    assert [d["index"] for d in rest["data"]] == [40, 99] and rest["has_more"] is False

    # replace (the default): the SAE's labels become the file's, gzip-compressed or not
    replaced = client.post(f"/api/saes/{sae}/labels", json={"path": "label-files/export.json.gz"}).json()
    assert replaced["labels"] == 3 and replaced["imported"] == 3
    assert_error(client.get(f"/api/saes/{sae}/labels/99"), 404, "label_not_found", "index")
    before = labels_of(client, sae)["data"]
    client.post(f"/api/saes/{sae}/labels", json={"path": str(files / "export.json")}).raise_for_status()
    after = labels_of(client, sae)["data"]
    assert [d | {"imported": 0} for d in after] == [d | {"imported": 0} for d in before]  # idempotent

    assert client.delete(f"/api/saes/{sae}/labels").json() == {"sae_id": sae, "deleted": 3}
    assert labels_of(client, sae)["data"] == []


def test_labels_beside_feature_indices(client, sae, attach, model_id):
    client.post(f"/api/saes/{sae}/labels", json={"labels": NEURONPEDIA}).raise_for_status()
    features = [{"index": 12, "strength": 4.0}, {"index": 13, "strength": 1.0}]
    profile = client.post("/api/profiles", json={"name": "cats", "sae_id": sae, "features": features}).json()
    assert profile["features"] == [
        {"index": 12, "strength": 4.0, "label": "references to cats and kittens"},
        {"index": 13, "strength": 1.0},  # no label: no key
    ]
    assert client.get("/api/profiles").json()["data"][0]["features"] == profile["features"]
    assert client.get("/api/profiles/cats").json()["features"] == profile["features"]

    cluster = {
        "format": "mi.cluster/v1",
        "cluster_id": "cl_certain",
        "name": "certain",
        "sae_id": sae,
        "layer": 0,
        "features": [{"index": 40, "strength": 2.0}],
    }
    imported = client.post("/api/clusters", json=cluster).json()
    assert imported["features"] == [{"index": 40, "strength": 2.0, "label": "100% certainty phrases"}]
    assert client.get("/api/clusters").json()["data"][0]["features"] == imported["features"]
    assert client.get("/api/clusters/cl_certain/export").json() == cluster  # the document stays as received

    circuit = {
        "format": "mi.circuit/v1",
        "circuit_id": "ci_code",
        "name": "code",
        "rung": 2,
        "members": [{"sae_id": sae, "layer": 0, "features": [{"index": 7, "strength": 1.0}]}],
    }
    client.post("/api/circuits", json=circuit).raise_for_status()
    member = client.get("/api/circuits/ci_code").json()["members"][0]
    assert member["features"] == [{"index": 7, "strength": 1.0, "label": "Python function definitions"}]
    assert client.get("/api/circuits").json()["data"][0]["members"][0] == member

    # live values, and the activations of the labelled features (looked up once per response)
    attach(sae, name="labelled")
    live = client.put("/api/steering", json={"sae_id": sae, "features": [{"index": 7, "strength": 1.0}]}).json()
    assert live["features"] == [{"index": 7, "strength": 1.0, "label": "Python function definitions"}]
    assert client.get("/api/steering").json()["manual"][0]["features"][0]["label"] == "Python function definitions"
    client.delete("/api/steering").raise_for_status()
    body = {
        "model": model_id,
        "prompt": "The lighthouse keeper",
        "max_tokens": 3,
        "temperature": 0,
        "return_sae_activations": {"sae_id": sae, "positions": "all", "top_k": 4, "features": [7, 12, 13, 40]},
    }
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    seen = [f for p in response.json()["millm"]["sae_activations"]["positions"] for f in p["features"]]
    assert seen, "no labelled feature was active"
    expected = {int(r["index"]): r["description"].strip() for r in NEURONPEDIA}
    for feature in seen:
        assert feature.get("label") == expected.get(feature["index"]), feature

    # the web UI shows them (served HTML: its pages are rendered on the server)
    page = client.get("/ui/steering")
    assert page.status_code == 200
    assert "references to cats and kittens" in page.text  # the profile's feature
    found = client.get("/ui/steering", params={"labels_sae": sae, "q": "python"})
    assert "Python function definitions" in found.text and "label-results" in found.text
    assert "100% certainty phrases" in client.get("/ui/clusters").text


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        (
            {"labels": [{"index": D_SAE, "description": "past the width"}]},
            400,
            "INVALID_FEATURE_INDEX",
            "labels[0].index",
        ),
        ({"labels": [{"index": -1, "description": "x"}]}, 400, "invalid_parameter", "labels[0].index"),
        ({"labels": [{"index": "1e3", "description": "x"}]}, 400, "invalid_parameter", "labels[0].index"),
        ({"labels": [{"index": True, "description": "x"}]}, 400, "invalid_parameter", "labels[0].index"),
        (
            {"labels": [{"index": 1, "description": "a"}, {"index": "1", "description": "b"}]},
            400,
            "invalid_parameter",
            "labels[1].index",
        ),
        ({"labels": [{"index": 1, "description": "bell\x07"}]}, 400, "invalid_parameter", "labels[0].description"),
        ({"labels": [{"index": 1, "description": "rtl\u202eevil"}]}, 400, "invalid_parameter", "labels[0].description"),
        ({"labels": [{"index": 1, "description": "   "}]}, 400, "invalid_parameter", "labels[0].description"),
        ({"labels": [{"index": 1, "description": "x" * 2001}]}, 400, "invalid_parameter", "labels[0].description"),
        ({"labels": [{"index": 1, "description": ["not", "text"]}]}, 400, "invalid_parameter", "labels[0].description"),
        ({"labels": [{"index": 1}]}, 400, "invalid_parameter", "labels[0].description"),
        (
            {"labels": [{"index": 1, "explanation": "x", "explanationScore": "high"}]},
            400,
            "invalid_parameter",
            "labels[0].explanationScore",
        ),
        ({"labels": ["just text"]}, 400, "invalid_parameter", "labels[0]"),
        ({"labels": []}, 400, "invalid_parameter", "labels"),
        ({"labels": {"index": 1}}, 400, "invalid_parameter", "labels"),
        (
            {"labels": [{"modelId": "gpt2-small", "layer": "6-res-jb", "index": "1", "description": "x"}]},
            400,
            "labels_of_another_sae",
            "labels",
        ),
        (
            {
                "labels": [
                    {"modelId": "tiny", "layer": "0-res-test", "index": "1", "description": "x"},
                    {"modelId": "tiny", "layer": "1-res-test", "index": "2", "description": "y"},
                ]
            },
            400,
            "invalid_parameter",
            "labels[1].layer",
        ),
        ({"content": "[" * 100_000}, 400, "invalid_parameter", "labels"),
        ({"content": '{"index": 1, "description": "x"}\n{"index": 2,'}, 400, "invalid_parameter", "labels"),
        ({"content": '[{"index": 1, "description": "x"}'}, 400, "invalid_parameter", "labels"),
        ({"content": "not json"}, 400, "invalid_parameter", "labels"),
        ({"content": ""}, 400, "invalid_parameter", "content"),
        ({"path": "label-files/latin1.json"}, 400, "invalid_parameter", "path"),
        ({"path": "label-files/../../etc/passwd"}, 400, "invalid_parameter", "path"),
        ({"path": "/etc/passwd"}, 400, "invalid_parameter", "path"),
        ({"path": "label-files/missing.json"}, 400, "invalid_parameter", "path"),
        ({"path": "label-files"}, 400, "invalid_parameter", "path"),
        ({"path": "label-files/export.json", "content": "[]"}, 400, "invalid_parameter", "content"),
        ({}, 400, "invalid_parameter", "path"),
        ({"content": "[]", "mode": "append"}, 400, "invalid_parameter", "mode"),
        ({"content": "[]", "duplicates": "last"}, 400, "invalid_parameter", "duplicates"),
        ({"content": "[]", "format": "csv"}, 400, "invalid_parameter", "format"),
    ],
)
def test_hostile_labels_are_refused(client, sae, files, body, status, code, param):
    assert_error(client.post(f"/api/saes/{sae}/labels", json=body), status, code, param)
    assert labels_of(client, sae)["data"] == []  # nothing half-imported


def test_lone_surrogates_and_unknown_saes_are_refused(client, sae):
    raw = b'{"content": "[{\\"index\\": 1, \\"description\\": \\"\\\\ud800\\"}]"}'
    response = client.post(f"/api/saes/{sae}/labels", content=raw, headers={"Content-Type": "application/json"})
    assert_error(response, 400, "invalid_parameter", "labels[0].description")
    raw = b'{"content": "\\ud800"}'
    response = client.post(f"/api/saes/{sae}/labels", content=raw, headers={"Content-Type": "application/json"})
    assert_error(response, 400, "invalid_parameter", "content")
    assert_error(client.post("/api/saes/nope/labels", json={"labels": NEURONPEDIA}), 404, "sae_not_found")
    assert_error(client.get("/api/saes/nope/labels"), 404, "sae_not_found")
    assert_error(client.get(f"/api/saes/{sae}/labels/x1"), 400, "invalid_parameter", "index")
    assert_error(client.get(f"/api/saes/{sae}/labels", params={"limit": "0"}), 400, "invalid_parameter", "limit")
    assert_error(client.get(f"/api/saes/{sae}/labels", params={"after": "-1"}), 400, "invalid_parameter", "after")
    assert_error(client.get(f"/api/saes/{sae}/labels", params={"q": "a\x00b"}), 400, "invalid_parameter", "q")


def test_duplicates_first_keeps_the_first_label(client, sae):
    records = [
        {"index": "3", "description": "first explanation", "typeName": "a"},
        {"index": "3", "description": "second explanation", "typeName": "b"},
    ]
    done = client.post(f"/api/saes/{sae}/labels", json={"labels": records, "duplicates": "first"}).json()
    assert done["imported"] == 1 and done["skipped_duplicates"] == 1
    assert client.get(f"/api/saes/{sae}/labels/3").json()["label"] == "first explanation"


def test_a_forgotten_sae_takes_its_labels(client, sae, sae_dir):
    client.post(f"/api/saes/{sae}/labels", json={"labels": NEURONPEDIA}).raise_for_status()
    client.delete(f"/api/saes/{sae}").raise_for_status()
    path = sae_dir("labelled", d_sae=D_SAE, neuronpedia_id="tiny/0-res-test")
    client.post("/api/saes", json={"path": str(path), "sae_id": sae}).raise_for_status()
    assert labels_of(client, sae)["data"] == []


def test_the_routes_are_documented(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"get", "post", "delete"} <= set(paths["/api/saes/{sae_id}/labels"])
    assert "get" in paths["/api/saes/{sae_id}/labels/{index}"]


def test_a_file_over_the_limit_is_refused(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(NEURONPEDIA * 50), encoding="utf-8")
    with pytest.raises(label_files.LabelsTooLarge):
        label_files.read_file(path, 1000)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b" " * 1_000_000))
    with pytest.raises(label_files.LabelsTooLarge):
        label_files.read_file(bomb, 1000)  # bounded once decompressed
    with pytest.raises(label_files.LabelsTooLarge):
        label_files.check_content("x" * 1001, 1000)
