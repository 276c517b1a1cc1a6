"""Steering a GGUF model through a real ``millm serve --engine gguf``: live values, inline sets,
profiles, circuits, the header and its hash, refusals by hook point, embeddings never steered."""

from __future__ import annotations

import pytest

from millm_host.api import parse_list
from millm_host.testing import assert_error

from .conftest import DEFAULT_ID, N_CTX, NO_STEERING, THREADS

write_sae = pytest.importorskip("millm_saelens.testing", reason=NO_STEERING).write_sae
steering_hash = pytest.importorskip("millm_steering.hashing", reason=NO_STEERING).steering_hash

D_MODEL = 576
FEATURES = [{"index": i, "strength": 12.0} for i in range(4)]


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory, gguf_path):
    saes = tmp_path_factory.mktemp("gguf-saes")
    for name, layer, point in (("post5", 5, "post"), ("post12", 12, "post"), ("post0", 0, "post"), ("pre1", 1, "pre")):
        write_sae(saes / name, d_in=D_MODEL, d_sae=32, layer=layer, point=point, seed=layer)
    server = server_factory(
        gguf_path,
        env={"MILLM_SAE_DIRS": str(saes), "GGUF_N_CTX": str(N_CTX), **THREADS},
        args=["--engine", "gguf"],
    )
    server.saes = saes
    return server


@pytest.fixture
def client(server):
    with server.http(timeout=120) as c:
        yield c


def register(client, server, name):
    if client.get(f"/api/saes/{name}").status_code == 404:
        client.post("/api/saes", json={"path": str(server.saes / name), "sae_id": name}).raise_for_status()


def chat(client, **fields):
    return client.post("/v1/chat/completions", json=fields)


def ask(client, **fields):
    body = {"model": DEFAULT_ID, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": "Hi!"}]}
    response = chat(client, **{**body, **fields})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"], response.headers.get("x-millm-steering")


def test_gguf_steering_end_to_end(client, server):
    plain, header = ask(client)
    assert header == "none"
    register(client, server, "post5")
    assert client.post("/api/saes/post5/attach", json={}).json()["hook_point"] == "blocks.5.hook_resid_post"

    # live values: steered, with the canonical hash of the features (the engine plays no part in it)
    client.put("/api/steering", json={"sae_id": "post5", "features": FEATURES}).raise_for_status()
    live, header = ask(client)
    assert live != plain
    member = parse_list(header)[0]
    assert str(member.value) == "manual"
    assert str(member.params["hash"]) == steering_hash("post5", {f["index"]: f["strength"] for f in FEATURES})
    assert ask(client, steering_intensity=0)[0] == plain  # off for this request only
    # an inline set replaces the live values; empty features: explicitly unsteered
    inline, header = ask(client, steering={"sae_id": "post5", "features": FEATURES[:1]})
    assert str(parse_list(header)[0].value) == "inline" and inline not in (plain, live)
    assert ask(client, steering={"features": []}) == (plain, "none")
    client.delete("/api/steering").raise_for_status()
    assert ask(client) == (plain, "none")  # cleared after each request, and the KV cache is not reused

    # a profile, sent by name
    client.post("/api/profiles", json={"name": "p5", "sae_id": "post5", "features": FEATURES}).raise_for_status()
    profiled, header = ask(client, profile="p5")
    assert profiled == live and str(parse_list(header)[0].value) == "profile"

    # a circuit over two layers
    register(client, server, "post12")
    client.post("/api/saes/post12/attach", json={}).raise_for_status()
    doc = {
        "format": "mi.circuit/v1",
        "circuit_id": "crc_g",
        "name": "gguf circuit",
        "rung": 2,
        "members": [
            {"sae_id": "post5", "layer": 5, "features": FEATURES},
            {"sae_id": "post12", "layer": 12, "features": FEATURES[:2]},
        ],
    }
    client.post("/api/circuits", json=doc).raise_for_status()
    client.post("/api/circuits/crc_g/activate").raise_for_status()
    try:
        response = chat(
            client, model=DEFAULT_ID, max_tokens=8, temperature=0, messages=[{"role": "user", "content": "Hi!"}]
        )
        assert [str(m.value) for m in parse_list(response.headers["x-millm-steering"])] == ["circuit"]
        assert response.headers["x-millm-circuit-rung"].startswith("2;")
        assert response.json()["choices"][0]["message"]["content"] not in (plain, live)
    finally:
        client.delete("/api/circuits/crc_g").raise_for_status()
    assert ask(client) == (plain, "none")


def test_points_no_control_vector_reaches_are_refused_by_name(client, server):
    for name, hook in (("post0", "blocks.0.hook_resid_post"), ("pre1", "blocks.1.hook_resid_pre")):
        register(client, server, name)
        error = assert_error(client.post(f"/api/saes/{name}/attach", json={}), 400, "field_not_honoured", "layer")
        assert hook in error["message"] and "hook_resid_post at layers 1-29" in error["message"]


def test_activations_are_refused_and_embeddings_never_steered(client, server):
    register(client, server, "post5")
    client.post("/api/saes/post5/attach", json={}).raise_for_status()
    body = {"model": DEFAULT_ID, "input": ["steer me not"], "encoding_format": "float"}
    before = client.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
    client.put("/api/steering", json={"sae_id": "post5", "features": FEATURES}).raise_for_status()
    try:
        assert client.post("/v1/embeddings", json=body).json()["data"][0]["embedding"] == before
        response = chat(
            client,
            model=DEFAULT_ID,
            max_tokens=1,
            messages=[{"role": "user", "content": "x"}],
            return_sae_activations={"sae_id": "post5"},
        )
        assert response.status_code == 400 and "return_sae_activations" in response.text
    finally:
        client.delete("/api/steering").raise_for_status()
