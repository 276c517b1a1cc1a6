"""The management API: SAEs, attachment, live values, profiles, the epoch, the lock, persistence."""

from __future__ import annotations

import pytest

from millm_host.testing import assert_error
from millm_saelens.testing import write_sae


def epoch(client) -> int:
    return client.get("/api/steering").json()["epoch"]


def test_register_list_show_delete(client, sae_dir):
    path = sae_dir("res-jb--layer_1", d_sae=300, layer=1, point="pre")
    registered = client.post("/api/saes", json={"path": str(path)}).json()
    assert registered == {
        "sae_id": "res-jb--layer_1",
        "path": str(path),
        "d_in": 64,
        "d_sae": 300,
        "layer": 1,
        "hook_point": "blocks.1.hook_resid_pre",
        "architecture": "standard",
        "k": None,
        "apply_b_dec_to_input": False,
        "model_name": "test",
        "created": registered["created"],
        "attached": [],
        "labels": 0,  # feature labels imported (test_labels.py)
    }
    assert client.get("/api/saes/res-jb--layer_1").json() == registered
    assert [s["sae_id"] for s in client.get("/api/saes").json()["data"]] == ["res-jb--layer_1"]
    assert_error(client.post("/api/saes", json={"path": str(path)}), 409, "sae_exists")
    assert client.delete("/api/saes/res-jb--layer_1").json() == {"sae_id": "res-jb--layer_1", "deleted": True}
    assert_error(client.get("/api/saes/res-jb--layer_1"), 404, "sae_not_found")
    assert_error(client.delete("/api/saes/res-jb--layer_1"), 404, "sae_not_found")


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({}, 400, "invalid_parameter", "path"),
        ({"path": "relative/dir"}, 400, "sae_unreadable", "path"),  # inside MILLM_SAE_DIRS, absent
        ({"path": "/nonexistent/sae"}, 400, "invalid_parameter", "path"),  # outside MILLM_SAE_DIRS
        ({"path": "x", "sae_id": "has space"}, 400, "invalid_parameter", "sae_id"),
        ({"path": "x", "sae_id": 5}, 400, "invalid_parameter", "sae_id"),
        ({"path": "x", "colour": "red"}, 400, "invalid_parameter", "colour"),
        ({"path": "/tmp/" + "a" * 256}, 400, "invalid_parameter", "path"),  # was OSError ENAMETOOLONG: a 500
        ({"path": "/tmp/" + "é" * 128 + "/x"}, 400, "invalid_parameter", "path"),  # 256 bytes in UTF-8
        ({"path": "/tmp/" + "a/" * 2100}, 400, "invalid_parameter", "path"),
        ({"path": "/tmp/a\u0000b"}, 400, "invalid_parameter", "path"),
    ],
)
def test_bad_registrations(client, body, status, code, param):
    assert_error(client.post("/api/saes", json=body), status, code, param)
    assert client.get("/api/saes").json()["data"] == []


def test_a_broken_directory_names_the_problem(client, sae_root):
    directory = write_sae(sae_root / "bad", d_in=64, d_sae=10, layer=0, architecture="topk")
    body = assert_error(client.post("/api/saes", json={"path": str(directory)}), 400, "sae_unreadable")
    assert "k must be" in body["message"]


def test_attach_and_detach(client, attach, model_id):
    first = attach("sae-a", layer=None)
    assert first["layer"] == 0 and first["hook_point"] == "blocks.0.hook_resid_post" and first["model"] == model_id
    again = client.post("/api/saes/sae-a/attach").json()  # idempotent: no change, no epoch move
    assert again["epoch"] == first["epoch"] == epoch(client)
    second = attach("sae-a", layer=1)  # one SAE at two layers
    assert second["hook_point"] == "blocks.1.hook_resid_post" and second["epoch"] == first["epoch"] + 1
    assert client.get("/api/saes/sae-a").json()["attached"] == [
        {"layer": 0, "hook_point": "blocks.0.hook_resid_post"},
        {"layer": 1, "hook_point": "blocks.1.hook_resid_post"},
    ]
    assert_error(client.delete("/api/saes/sae-a"), 409, "sae_attached")
    detached = client.post("/api/saes/sae-a/detach", json={"layer": 1}).json()
    assert detached["detached"] == [{"layer": 1, "hook_point": "blocks.1.hook_resid_post"}]
    assert_error(client.post("/api/saes/sae-a/detach", json={"layer": 1}), 400, "SAE_NOT_ATTACHED")
    client.post("/api/saes/sae-a/detach").raise_for_status()
    assert client.get("/api/saes/sae-a").json()["attached"] == []


def test_attach_refusals(client, sae_dir):
    wide = sae_dir("wide", d_in=128)
    client.post("/api/saes", json={"path": str(wide)}).raise_for_status()
    body = assert_error(client.post("/api/saes/wide/attach"), 400, "sae_incompatible")
    assert "128" in body["message"] and "64" in body["message"]
    client.post("/api/saes", json={"path": str(sae_dir("narrow")), "sae_id": "narrow"}).raise_for_status()
    assert_error(client.post("/api/saes/narrow/attach", json={"layer": 2}), 400, "invalid_parameter", "layer")
    assert_error(client.post("/api/saes/narrow/attach", json={"layer": -1}), 400, "invalid_parameter", "layer")
    assert_error(client.post("/api/saes/absent/attach"), 404, "sae_not_found")
    assert client.get("/api/steering").json()["attached"] == []


def test_weights_changed_since_registration_are_refused_at_attach(client, sae_root, tmp_path):
    directory = write_sae(sae_root / "moving", d_in=64, d_sae=10, layer=0)
    client.post("/api/saes", json={"path": str(directory)}).raise_for_status()
    weights = directory / "sae_weights.safetensors"
    weights.write_bytes((write_sae(tmp_path / "wider", d_in=64, d_sae=12, layer=0) / weights.name).read_bytes())
    assert "changed shape" in assert_error(client.post("/api/saes/moving/attach"), 400, "sae_unreadable")["message"]
    weights.write_bytes(b"not safetensors")
    assert "cannot be read" in assert_error(client.post("/api/saes/moving/attach"), 400, "sae_unreadable")["message"]
    weights.unlink()
    assert "cannot be read" in assert_error(client.post("/api/saes/moving/attach"), 400, "sae_unreadable")["message"]
    assert client.get("/api/steering").json()["attached"] == []


def test_live_values(client, attach):
    attach("sae-a")
    start = epoch(client)
    put = client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 5, "strength": 3.0}]})
    assert put.json() == {
        "sae_id": "sae-a",
        "layer": 0,
        "features": [{"index": 5, "strength": 3.0}],
        "live": True,
        "reason": None,
        "epoch": start + 1,
    }
    state = client.get("/api/steering").json()
    assert state["manual"][0]["live"] and state["applied"].startswith('manual;sae="sae-a";layer=0;features=1;')
    assert_error(
        client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 256, "strength": 1}]}),
        400,
        "INVALID_FEATURE_INDEX",
        "features[0].index",
    )
    assert_error(
        client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 1, "strength": 201}]}),
        400,
        "invalid_parameter",
        "features[0].strength",
    )
    assert_error(
        client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 1, "strength": True}]}),
        400,
        "invalid_parameter",
        "features[0].strength",
    )
    assert_error(
        client.put(
            "/api/steering",
            json={"sae_id": "sae-a", "features": [{"index": 1, "strength": 1}, {"index": 1, "strength": 2}]},
        ),
        400,
        "invalid_parameter",
        "features[1].index",
    )
    assert_error(
        client.put("/api/steering", json={"sae_id": "other", "features": []}), 400, "SAE_NOT_ATTACHED", "sae_id"
    )
    assert epoch(client) == start + 1  # refusals change nothing

    client.post("/api/profiles", json={"name": "p", "sae_id": "sae-a", "features": [{"index": 1, "strength": 1}]})
    client.post("/api/profiles/p/activate").raise_for_status()
    claimed = client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 5, "strength": 4.0}]})
    assert claimed.json()["live"] is False and claimed.json()["reason"] == "claimed_by_active_profile"
    cleared = client.delete("/api/steering").json()
    assert cleared["manual"] == [] and cleared["active_profile"] == "p"


def test_profiles(client, attach, sae_dir):
    client.post("/api/saes", json={"path": str(sae_dir("sae-b")), "sae_id": "sae-b"}).raise_for_status()
    created = client.post(
        "/api/profiles", json={"name": "humör", "sae_id": "sae-b", "features": [{"index": 12, "strength": 8.0}]}
    ).json()
    assert created == {
        "name": "humör",
        "sae_id": "sae-b",
        "layer": 0,
        "features": [{"index": 12, "strength": 8.0}],
        "created": created["created"],
        "active": False,
        "live": False,
        "cluster_id": None,
    }
    assert client.get("/api/profiles/humör").json() == created
    assert [p["name"] for p in client.get("/api/profiles").json()["data"]] == ["humör"]
    assert_error(
        client.post(
            "/api/profiles", json={"name": "humör", "sae_id": "sae-b", "features": [{"index": 1, "strength": 1}]}
        ),
        409,
        "profile_exists",
    )
    assert_error(
        client.post(
            "/api/profiles", json={"name": "x", "sae_id": "sae-b", "features": [{"index": 256, "strength": 1}]}
        ),
        400,
        "INVALID_FEATURE_INDEX",
        "features[0].index",
    )
    assert_error(
        client.post("/api/profiles", json={"name": "x", "sae_id": "nope", "features": [{"index": 1, "strength": 1}]}),
        404,
        "sae_not_found",
    )
    assert_error(
        client.post("/api/profiles", json={"name": "x", "sae_id": "sae-b", "features": []}),
        400,
        "invalid_parameter",
        "features",
    )
    assert_error(
        client.post(
            "/api/profiles", json={"name": "a/b", "sae_id": "sae-b", "features": [{"index": 1, "strength": 1}]}
        ),
        400,
        "invalid_parameter",
        "name",
    )
    assert_error(
        client.post(
            "/api/profiles", json={"name": "deactivate", "sae_id": "sae-b", "features": [{"index": 1, "strength": 1}]}
        ),
        400,
        "invalid_parameter",
        "name",
    )
    assert_error(client.delete("/api/saes/sae-b"), 409, "sae_in_use")

    activated = client.post("/api/profiles/humör/activate").json()
    assert activated["active"] and not activated["live"]  # its SAE is not attached yet
    attach("sae-b")
    assert client.get("/api/profiles/humör").json()["live"]
    assert (
        client.get("/api/steering")
        .json()["applied"]
        .startswith('profile;name="hum%C3%B6r";source=active;intensity="1.0";sae="sae-b";layer=0;features=1;')
    )
    before = epoch(client)
    assert client.post("/api/profiles/deactivate").json() == {"active_profile": None, "epoch": before + 1}
    client.post("/api/profiles/humör/activate").raise_for_status()
    client.delete("/api/profiles/humör").raise_for_status()  # deleting the active profile deactivates it
    assert client.get("/api/steering").json()["active_profile"] is None
    assert_error(client.get("/api/profiles/humör"), 404, "profile_not_found")
    assert_error(client.post("/api/profiles/humör/activate"), 404, "profile_not_found")


def test_every_management_change_moves_the_epoch(client, attach, sae_dir):
    seen = [epoch(client)]

    def step(response):
        response.raise_for_status()
        seen.append(epoch(client))

    step(client.post("/api/saes", json={"path": str(sae_dir("sae-e")), "sae_id": "sae-e"}))
    step(client.post("/api/saes/sae-e/attach"))
    step(client.put("/api/steering", json={"sae_id": "sae-e", "features": [{"index": 1, "strength": 1}]}))
    step(client.delete("/api/steering"))
    step(client.post("/api/profiles", json={"name": "e", "sae_id": "sae-e", "features": [{"index": 1, "strength": 1}]}))
    step(client.post("/api/profiles/e/activate"))
    step(client.post("/api/profiles/deactivate"))
    step(client.delete("/api/profiles/e"))
    step(client.post("/api/steering/lock"))
    step(client.delete("/api/steering/lock"))
    step(client.post("/api/saes/sae-e/detach"))
    step(client.delete("/api/saes/sae-e"))
    assert seen == list(range(seen[0], seen[0] + len(seen)))


def test_the_lock_narrows_v1_models(client, model_id):
    everything = {m["id"] for m in client.get("/v1/models").json()["data"]}
    assert model_id in everything and len(everything) > 1  # the bundled default model is listed too
    assert client.post("/api/steering/lock").json() == {"locked": True, "model": model_id}
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [model_id]
    other = next(iter(everything - {model_id}))
    assert_error(client.get(f"/v1/models/{other}"), 404, "model_not_found")
    assert_error(client.post("/api/steering/lock", json={"model": "no-such-model"}), 404, "model_not_found")
    client.delete("/api/steering/lock").raise_for_status()
    assert {m["id"] for m in client.get("/v1/models").json()["data"]} == everything


def test_saes_profiles_and_the_lock_survive_a_restart(server_factory, tiny_model_dir, sae_dir, sae_root):
    server = server_factory(tiny_model_dir, env={"MILLM_SAE_DIRS": str(sae_root)})
    with server.http() as client:
        client.post("/api/saes", json={"path": str(sae_dir("kept")), "sae_id": "kept"}).raise_for_status()
        client.post(
            "/api/profiles",
            json={"name": "kept-profile", "sae_id": "kept", "layer": 1, "features": [{"index": 3, "strength": 0.1}]},
        ).raise_for_status()
        client.post("/api/steering/lock").raise_for_status()
        saes, profiles = client.get("/api/saes").json(), client.get("/api/profiles").json()
    server.restart()
    with server.http() as client:
        assert client.get("/api/saes").json() == saes
        assert client.get("/api/profiles").json() == profiles
        assert client.get("/api/steering/lock").json()["locked"]
        assert client.post("/api/saes/kept/attach").json()["layer"] == 0
    server.stop()


def test_unloading_the_model_detaches_its_saes(client, attach, model_id):
    attach("sae-a")
    client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 5, "strength": 3.0}]})
    client.post(f"/api/models/{model_id}/unload").raise_for_status()
    try:
        state = client.get("/api/steering").json()
        assert state["attached"] == [] and state["manual"] == [] and state["applied"] == "none"
        assert client.get("/api/saes/sae-a").json()["attached"] == []
        assert_error(client.post("/api/saes/sae-a/attach"), 503, "model_not_loaded")
    finally:
        client.post(f"/api/models/{model_id}/load").raise_for_status()
    attach("sae-a")
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": model_id,
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "Hi"}],
            "steering": {"features": [{"index": 5, "strength": 3.0}]},
        },
    )
    assert response.headers["x-millm-steering"].startswith('inline;sae="sae-a";layer=0;features=1;')
