"""Imported clusters (``mi.cluster/v1``): import, lossless export, activation, the persistent dial, the λ rule."""

from __future__ import annotations

import pytest

from millm_host.api import parse_list
from millm_host.testing import AppServer, assert_error, chat as post_chat
from millm_steering.intensity import Dial, Dialing, Limits, cluster_lam


def cluster_doc(**overrides):
    doc = {
        "format": "mi.cluster/v1",
        "cluster_id": "cl_humor",
        "name": "humor",
        "sae_id": "sae-c",
        "layer": 0,
        "features": [{"index": 12, "strength": 8.0}, {"index": 40, "strength": 150.0}],
        "intensity_range": [0.5, 1.5],
        "producer": {"tool": "workbench", "note": "kept verbatim"},  # unknown keys survive re-export
    }
    doc.update(overrides)
    return {k: v for k, v in doc.items() if v is not None}


def params(value):
    return [(str(m.value), dict(m.params)) for m in parse_list(value)]


@pytest.fixture
def chat(client, model_id):
    def send(**fields):
        return post_chat(client, **{"model": model_id, "max_tokens": 2, "temperature": 0, **fields})

    return send


def test_import_list_get_export_delete(client, sae_dir):
    client.post("/api/saes", json={"path": str(sae_dir("sae-c")), "sae_id": "sae-c"}).raise_for_status()
    doc = cluster_doc()
    imported = client.post("/api/clusters", json=doc).json()
    assert imported["cluster_id"] == "cl_humor" and imported["profile"] == "humor"
    assert imported["intensity"] == 1.0 and imported["intensity_bounds"] == [0.0, 1.5]
    assert imported["intensity_range"] == [0.5, 1.5] and not imported["active"]
    assert client.get("/api/clusters/cl_humor").json() == imported
    assert [c["cluster_id"] for c in client.get("/api/clusters").json()["data"]] == ["cl_humor"]
    assert client.get("/api/clusters/cl_humor/export").json() == doc  # lossless
    assert client.get("/api/profiles/humor").json()["cluster_id"] == "cl_humor"
    assert_error(client.post("/api/clusters", json=doc), 409, "cluster_exists")
    assert_error(client.post("/api/clusters", json=cluster_doc(cluster_id="cl_other")), 409, "profile_exists")
    assert_error(client.delete("/api/profiles/humor"), 409, "profile_is_cluster")
    assert client.delete("/api/clusters/cl_humor").json() == {"cluster_id": "cl_humor", "deleted": True}
    assert_error(client.get("/api/clusters/cl_humor"), 404, "cluster_not_found")
    assert_error(client.get("/api/profiles/humor"), 404, "profile_not_found")


@pytest.mark.parametrize(
    ("doc", "status", "code", "param"),
    [
        (cluster_doc(format="mi.cluster/v2"), 400, "invalid_parameter", "format"),
        (cluster_doc(cluster_id="has space"), 400, "invalid_parameter", "cluster_id"),
        (cluster_doc(features=[]), 400, "invalid_parameter", "features"),
        (cluster_doc(features=[{"index": 256, "strength": 1}]), 400, "INVALID_FEATURE_INDEX", "features[0].index"),
        (cluster_doc(intensity_range=[1.5, 0.5]), 400, "invalid_parameter", "intensity_range"),
        (cluster_doc(layer=-1), 400, "invalid_parameter", "layer"),
        (cluster_doc(sae_id="nope"), 404, "sae_not_found", "sae_id"),
    ],
)
def test_bad_documents(client, sae_dir, doc, status, code, param):
    client.post("/api/saes", json={"path": str(sae_dir("sae-c")), "sae_id": "sae-c"}).raise_for_status()
    assert_error(client.post("/api/clusters", json=doc), status, code, param)
    assert client.get("/api/clusters").json()["data"] == []


@pytest.mark.parametrize(
    ("dial", "declared", "stored", "expected"),
    [
        (None, (0.5, 1.5), 1.2, 1.2),  # the stored dial applies
        (Dial(number=0.8), (0.5, 1.5), 1.2, 0.8),  # the request overrides it
        (Dial(number=1.9), (0.5, 1.5), 1.0, 1.5),  # capped at the range's maximum
        (Dial(number=0.1), (0.5, 1.5), 1.0, 0.1),  # below the floor is honoured
        (Dial(symbol="min"), (0.5, 1.5), 1.0, 0.5),
        (Dial(symbol="max"), (0.5, 3.0), 1.0, 2.0),  # ∩ [0, 2]
        (Dial(symbol="min"), None, 1.0, 0.5),  # CLUSTER_INTENSITY_MIN
        (Dial(number=1.9), None, 1.0, 1.9),  # CLUSTER_INTENSITY_MAX (2.0) caps
        (Dial(symbol="off"), (0.5, 1.5), 1.0, 0.0),
    ],
)
def test_the_cluster_rule(dial, declared, stored, expected):
    assert cluster_lam(dial, declared, stored, Limits()) == expected
    assert Dialing(dial, Limits()).cluster(declared, stored) == expected


def test_the_dial_steers_requests_and_strengths_clamp(client, attach, chat, sae_dir):
    attach("sae-c")
    client.post("/api/clusters", json=cluster_doc()).raise_for_status()
    activated = client.post("/api/clusters/cl_humor/activate").json()
    assert activated["active"] and activated["live"]

    response = chat()
    ((kind, p),) = params(response.headers["x-millm-steering"])
    assert (kind, p["name"], str(p["source"]), p["intensity"]) == ("profile", "humor", "active", "1.0")
    assert p["features"] == 2 and "clamped" not in p

    dialled = client.put("/api/clusters/cl_humor/intensity", json={"intensity": 1.5}).json()
    assert dialled["intensity"] == 1.5
    ((_, p),) = params(chat().headers["x-millm-steering"])
    assert p["intensity"] == "1.5" and p["clamped"] == 1  # 150 × 1.5 clamped to 200

    assert_error(client.put("/api/clusters/cl_humor/intensity", json={"intensity": 1.6}), 400, "invalid_parameter")
    assert_error(client.put("/api/clusters/cl_humor/intensity", json={"intensity": -0.1}), 400, "invalid_parameter")

    override = chat(steering_intensity=0.25)  # below the floor: honoured, for this request only
    assert params(override.headers["x-millm-steering"])[0][1]["intensity"] == "0.25"
    assert override.headers["x-millm-steering-intensity"] == '"0.25"'
    capped = chat(steering_intensity=2)
    assert params(capped.headers["x-millm-steering"])[0][1]["intensity"] == "1.5"
    assert chat(steering_intensity="min").headers["x-millm-steering-intensity"] == '"0.5"'
    assert chat(steering_intensity="off").headers["x-millm-steering"] == "none"
    assert client.get("/api/clusters/cl_humor").json()["intensity"] == 1.5  # the stored dial is untouched

    by_name = chat(profile="humor", steering_intensity=1.0)
    assert params(by_name.headers["x-millm-steering"])[0][1]["source"].__str__() == "request"

    deactivated = client.post("/api/clusters/cl_humor/deactivate").json()
    assert not deactivated["active"] and chat().headers["x-millm-steering"] == "none"


def test_off_does_not_validate_the_base(client, attach, chat, sae_dir):
    attach("sae-c")
    client.post("/api/saes", json={"path": str(sae_dir("sae-d")), "sae_id": "sae-d"}).raise_for_status()
    client.post("/api/clusters", json=cluster_doc(sae_id="sae-d", name="elsewhere")).raise_for_status()
    assert_error(chat(profile="elsewhere", steering_intensity=0.01), 400, "SAE_NOT_ATTACHED", "profile")
    assert chat(profile="elsewhere", steering_intensity=0).headers["x-millm-steering"] == "none"
    assert chat(profile="elsewhere", steering_intensity="off").status_code == 200


def test_the_dial_survives_a_restart(tiny_model_dir, sae_dir, sae_root, tmp_path):
    """An app stopped and another started on its data directory (in-process: the dial is state in the
    database; ``test_management`` restarts a real server)."""
    options = {"plugins": "all", "models": {}, "model": str(tiny_model_dir), "env": {"MILLM_SAE_DIRS": str(sae_root)}}
    with AppServer(tmp_path, **options) as server, server.http() as client:
        client.post("/api/saes", json={"path": str(sae_dir("sae-c")), "sae_id": "sae-c"}).raise_for_status()
        client.post("/api/clusters", json=cluster_doc()).raise_for_status()
        client.put("/api/clusters/cl_humor/intensity", json={"intensity": 0.75}).raise_for_status()
        before = client.get("/api/clusters/cl_humor").json()
    with AppServer(tmp_path, **options) as server, server.http() as client:
        assert client.get("/api/clusters/cl_humor").json() == before
        assert before["intensity"] == 0.75
        assert client.get("/api/clusters/cl_humor/export").json() == cluster_doc()
