"""Imported circuits (``mi.circuit/v1``): the circuit rule, slice fallback, the rung header, the header
grammar, embeddings and scoring, and the residual at every member layer."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

from millm_host.api import parse_list
from millm_host.testing import assert_error, chat as post_chat
from millm_steering.intensity import Dial, Limits, circuit_lam

from .test_correctness import D, identity_tensors, residuals
from .test_requests import _long_stream

MEMBERS = [
    {"sae_id": "c0", "layer": 0, "features": [{"index": 3, "strength": 4.0}, {"index": 9, "strength": 150.0}]},
    {"sae_id": "c1", "layer": 1, "features": [{"index": 7, "strength": -2.0}]},
]


def circuit_doc(circuit_id="crc_a", rung=2, members=MEMBERS, fallback=None, **extra):
    doc = {
        "format": "mi.circuit/v1",
        "circuit_id": circuit_id,
        "name": f"circuit {circuit_id}",
        "rung": rung,
        "intensity_range": [0.5, 1.5],
        "members": members,
        **extra,
    }
    if fallback is not None:
        doc["slice_fallback"] = {"cluster": fallback}
    return {k: v for k, v in doc.items() if v is not None}


FALLBACK = {
    "format": "mi.cluster/v1",
    "cluster_id": "cl_fb",
    "name": "fallback",
    "sae_id": "fb",
    "layer": 1,
    "features": [{"index": 2, "strength": 3.0}],
}


def members(value):
    return [
        (str(m.value), {k: (str(v) if not isinstance(v, (bool, int)) else v) for k, v in m.params.items()})
        for m in parse_list(value)
    ]


@pytest.fixture
def chat(client, model_id):
    def send(**fields):
        return post_chat(client, **{"model": model_id, "max_tokens": 2, "temperature": 0, **fields})

    return send


@pytest.fixture
def circuit(client, attach):
    """Both member SAEs attached, the circuit imported and active."""
    attach("c0", d_sae=256, seed=11)
    attach("c1", d_sae=256, seed=12, layer=1)
    client.post("/api/circuits", json=circuit_doc(fallback=FALLBACK, extra_key=[1, 2])).raise_for_status()
    client.post("/api/circuits/crc_a/activate").raise_for_status()


@pytest.mark.parametrize(
    ("dial", "declared", "stored", "expected"),
    [
        (Dial(number=0.1), (0.5, 1.5), 1.0, 0.5),  # both ends clamp
        (Dial(number=1.9), (0.5, 1.5), 1.0, 1.5),
        (Dial(number=0.0), (0.5, 1.5), 1.0, 0.0),  # only an exact 0 goes below
        (Dial(symbol="off"), (0.5, 1.5), 1.0, 0.0),
        (Dial(symbol="min"), None, 1.0, 0.0),  # CIRCUIT_INTENSITY_MIN: min is off
        (Dial(symbol="max"), (0.5, 3.0), 1.0, 2.0),
        (None, (0.5, 1.5), 0.2, 0.5),  # the stored dial is clamped too
        (None, (0.5, 1.5), 0.0, 0.0),
    ],
)
def test_the_circuit_rule(dial, declared, stored, expected):
    assert circuit_lam(dial, declared, stored, Limits()) == expected


def test_import_list_get_export_activate_delete(client, attach):
    doc = circuit_doc(fallback=FALLBACK, producer={"x": 1})
    imported = client.post("/api/circuits", json=doc).json()
    assert imported["rung"] == 2 and imported["language"] == "causally validated (edge)"
    assert imported["slice_fallback"] == {"cluster_id": "cl_fb"} and not imported["active"]
    assert client.get("/api/circuits/crc_a").json() == imported
    assert client.get("/api/circuits/crc_a/export").json() == doc
    assert [c["circuit_id"] for c in client.get("/api/circuits").json()["data"]] == ["crc_a"]
    assert_error(client.post("/api/circuits", json=doc), 409, "circuit_exists")
    assert_error(client.post("/api/circuits", json=circuit_doc("active")), 400, "invalid_parameter", "circuit_id")
    assert_error(client.post("/api/circuits", json=circuit_doc(rung=4)), 400, "invalid_parameter", "rung")
    assert_error(client.post("/api/circuits", json=circuit_doc(rung={})), 400, "invalid_parameter", "rung")  # was a 500
    bad_member = [{"sae_id": "c0", "layer": 0, "features": [{"index": 1, "strength": "x"}]}]
    assert_error(
        client.post("/api/circuits", json=circuit_doc("crc_b", members=bad_member)),
        400,
        "invalid_parameter",
        "members[0].features[0].strength",
    )
    assert client.get("/api/circuits/active").json()["data"] == []
    active = client.post("/api/circuits/crc_a/activate").json()
    assert active["active"] and active["steering"]["mode"] == "none"  # nothing attached
    assert active["steering"]["reason"] == "sae_not_attached"
    assert [c["circuit_id"] for c in client.get("/api/circuits/active").json()["data"]] == ["crc_a"]
    client.delete("/api/circuits/crc_a").raise_for_status()
    assert client.get("/api/circuits/active").json()["data"] == []
    assert_error(client.get("/api/circuits/crc_a"), 404, "circuit_not_found")


def test_a_circuit_steers_every_member_and_sends_its_rung(client, circuit, chat):
    response = chat()
    assert members(response.headers["x-millm-steering"]) == [("circuit", {"id": "crc_a", "intensity": "1.0"})]
    assert response.headers["x-millm-circuit-rung"] == '2; language="causally validated (edge)"'
    rung = parse_list(response.headers["x-millm-circuit-rung"])[0]
    assert rung.value == 2 and str(rung.params["language"]) == "causally validated (edge)"
    steering = client.get("/api/circuits/active").json()["data"][0]["steering"]
    assert steering["mode"] == "circuit" and [entry["layer"] for entry in steering["layers"]] == [0, 1]
    assert steering["rung_header"] == response.headers["x-millm-circuit-rung"]

    clamped = chat(steering_intensity=0.1)  # clamped to the floor, 0.5
    assert members(clamped.headers["x-millm-steering"])[0][1]["intensity"] == "0.5"
    for off in (0, "off"):
        unsteered = chat(steering_intensity=off)
        assert unsteered.headers["x-millm-steering"] == "none" and "x-millm-circuit-rung" not in unsteered.headers
    inline = chat(steering={"sae_id": "c0", "features": [{"index": 1, "strength": 1.0}]})
    assert members(inline.headers["x-millm-steering"])[0][0] == "inline"
    assert "x-millm-circuit-rung" not in inline.headers

    client.put("/api/circuits/crc_a/intensity", json={"intensity": 0.75}).raise_for_status()
    assert members(chat().headers["x-millm-steering"])[0][1]["intensity"] == "0.75"
    assert_error(client.put("/api/circuits/crc_a/intensity", json={"intensity": 1.6}), 400, "invalid_parameter")


def test_member_order_composed_and_a_profile_beside(client, circuit, chat):
    second = [{"sae_id": "c1", "layer": 1, "features": [{"index": 5, "strength": 1.0}]}]
    client.post("/api/circuits", json=circuit_doc("crc_0", rung=1, members=second)).raise_for_status()
    client.post("/api/circuits/crc_0/activate").raise_for_status()
    client.post("/api/profiles", json={"name": "p", "sae_id": "c0", "features": [{"index": 1, "strength": 1}]})
    client.post("/api/profiles/p/activate").raise_for_status()
    response = chat()
    found = members(response.headers["x-millm-steering"])
    assert [(kind, p.get("id", p.get("name"))) for kind, p in found] == [
        ("circuit", "crc_0"),
        ("circuit", "crc_a"),
        ("profile", "p"),
    ]
    assert found[0][1]["composed"] is True and found[1][1]["composed"] is True  # both serve layer 1
    assert response.headers["x-millm-circuit-rung"].startswith("1; ")  # the weakest rung that steered


def test_slice_fallback_serves_the_cluster_without_a_rung(client, attach, chat):
    attach("c0", d_sae=256, seed=11)
    attach("fb", d_sae=256, seed=13, layer=1)
    client.post("/api/circuits", json=circuit_doc(fallback=FALLBACK)).raise_for_status()
    client.post("/api/circuits/crc_a/activate").raise_for_status()
    response = chat()
    ((kind, p),) = members(response.headers["x-millm-steering"])
    assert (kind, p["name"], p["sae"], p["layer"]) == ("profile", "fallback", "fb", 1)
    assert "x-millm-circuit-rung" not in response.headers
    assert client.get("/api/circuits/active").json()["data"][0]["steering"]["mode"] == "slice_fallback"
    # the cluster rule applies to the fallback: 0.1 is honoured below its 0.5 floor
    low = chat(steering_intensity=0.1)
    assert members(low.headers["x-millm-steering"])[0][1]["intensity"] == "0.1"


def test_no_sae_attached_on_any_member_layer_and_an_unreadable_definition(client, attach, chat):
    client.post("/api/circuits", json=circuit_doc()).raise_for_status()
    client.post("/api/circuits/crc_a/activate").raise_for_status()
    attach("other", d_sae=64)
    response = chat()
    assert response.headers["x-millm-steering"] == "none" and "x-millm-circuit-rung" not in response.headers
    attach(
        "c0", name="c0-narrow", d_sae=8
    )  # the member's feature 9 is past this SAE's width: the definition cannot be read
    unreadable = chat()
    assert unreadable.headers["x-millm-steering"] == "unknown;reason=claims_unreadable"
    assert "x-millm-circuit-rung" not in unreadable.headers
    assert client.get("/api/circuits/active").json()["data"][0]["steering"]["reason"] == "unreadable"


def test_embeddings_and_scoring_are_never_steered_by_a_circuit(client, model_id, circuit):
    body = {"model": model_id, "input": ["steer me not"], "encoding_format": "float"}
    steered = client.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
    client.post("/api/circuits/crc_a/deactivate").raise_for_status()
    plain = client.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
    assert steered == plain
    scoring = {"model": model_id, "prompt": "The answer is", "max_tokens": 1, "logprobs": 3}
    unsteered = client.post("/v1/completions", json=scoring)
    client.post("/api/circuits/crc_a/activate").raise_for_status()
    scored = client.post("/v1/completions", json=scoring)
    assert scored.json()["choices"][0]["logprobs"] == unsteered.json()["choices"][0]["logprobs"]
    assert scored.headers["x-millm-steering"] == "none" and "x-millm-circuit-rung" not in scored.headers


def test_streams_carry_the_rung_and_the_circuit_member(client, model_id, circuit):
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": model_id, "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
    ) as response:
        assert response.headers["x-millm-circuit-rung"] == '2; language="causally validated (edge)"'
        text = "".join(response.iter_text())
    assert 'circuit;id=\\"crc_a\\";intensity=\\"1.0\\"' in text


def test_the_residual_moves_by_each_member_at_its_layer(client, attach, sae_dir, model_id, circuit):
    """At every member layer: steered = unsteered + Σ s·W_dec (λ applied, ±200 clamp), within 1e-5."""
    attach("identity", d_sae=2 * D, tensors=identity_tensors())
    attach("identity", layer=1)
    lam = 1.5  # 150 × 1.5 reaches the clamp
    client.put("/api/circuits/crc_a/intensity", json={"intensity": lam}).raise_for_status()
    for member in MEMBERS:
        w_dec = load_file(str(sae_dir(member["sae_id"]) / "sae_weights.safetensors"))["W_dec"].astype(np.float64)
        delta = sum(max(-200.0, min(200.0, f["strength"] * lam)) * w_dec[f["index"]] for f in member["features"])
        read = {}
        for point in ("pre_steering", "post_steering"):
            response = client.post(
                "/v1/chat/completions",
                json={
                    "model": model_id,
                    "max_tokens": 4,
                    "temperature": 0,
                    "messages": [{"role": "user", "content": "Tell me about the sea"}],
                    "return_sae_activations": {
                        "sae_id": "identity",
                        "layer": member["layer"],
                        "top_k": D,
                        "positions": "all",
                        "read_point": point,
                    },
                },
            )
            assert response.status_code == 200, response.text
            assert response.headers["x-millm-steering"].startswith('circuit;id="crc_a";intensity="1.5"')
            read[point] = residuals(response.json())
        assert read["pre_steering"][0] == read["post_steering"][0]  # the same tokens
        np.testing.assert_allclose(read["post_steering"][1], read["pre_steering"][1] + delta, atol=1e-5, rtol=0)


def test_an_operator_dial_change_mid_request_is_reported_as_changed(server, model_id, circuit):
    """The operator moves the circuit's dial while a long stream runs: the header reports the state at the
    end (the new λ) on the circuit member, flagged ``changed`` (the spec's operator-change rule)."""
    with server.http() as client, server.http() as operator:

        def turn_the_dial() -> None:
            operator.put("/api/circuits/crc_a/intensity", json={"intensity": 1.25}).raise_for_status()

        [(kind, params), *_] = _long_stream(client, model_id, turn_the_dial)
    assert kind == "circuit" and params["id"] == "crc_a"
    assert params["intensity"] == "1.25" and params["changed"] is True
