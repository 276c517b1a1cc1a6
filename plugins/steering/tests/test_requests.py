"""Per-request steering: profile, steering_intensity, inline steering, and the X-miLLM-Steering header."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest

from millm_host.api import parse_list
from millm_host.testing import assert_error, chat as post_chat

LFM = "LiquidAI--LFM2.5-1.2B-Instruct-sae--layer_11"
GEMMA = "jbloom--gemma-2-2b-res-jb--layer_20--width_16k--average_l0_71"


def spec_hash(sae_id, features, scale=1.0):
    """The spec's reference function (with a profile's λ applied first)."""
    applied = {i: max(-200.0, min(200.0, float(s) * scale)) for i, s in features}
    applied = {i: s for i, s in applied.items() if s != 0.0}
    lines = ["millm.steering-set/v1", f"sae={sae_id}"]
    lines += [f"{i}:{struct.pack('>d', applied[i]).hex()}" for i in sorted(applied)]
    return "sha256:" + hashlib.sha256("".join(line + "\n" for line in lines).encode()).hexdigest()


def members(value):
    return [(str(m.value), dict(m.params)) for m in parse_list(value)]


@pytest.fixture
def chat(client, model_id):
    """``chat(**fields)``: a short greedy chat completion; returns the httpx response."""

    def send(endpoint="/v1/chat/completions", **fields):
        fields = {"model": model_id, "max_tokens": 4, "temperature": 0, **fields}
        if endpoint.endswith("chat/completions"):
            return post_chat(client, **fields)
        return client.post(endpoint, json={"prompt": "Once upon a time", **fields})

    return send


@pytest.mark.parametrize(
    ("sae_id", "features", "digest", "clamped"),
    [
        (LFM, [(1234, 8.0)], "sha256:a4eae730e5105f422b93abeece7e03bda3c29b096c07aa9cee6f247e12844105", None),
        (LFM, [(1234, -8.0)], "sha256:cc6c48faa720096e5c65fc1b2afab1b9b87659fb4465f20db421a2ed7fed78a7", None),
        (
            GEMMA,
            [(77, -2.5), (5, 0.1), (900, 0.0), (12, -0.0)],
            "sha256:b843912201c5c18f872976e35af288e5f484d81e31a03a1dc16c3b9dbd82e710",
            None,
        ),
        (GEMMA, [(3, 500.0)], "sha256:3f51779e6e33ee248acf6f520cb9475b4ef62f68275060bb69d2e228033b78df", 1),
    ],
    ids=["TV-1", "TV-2", "TV-3", "TV-4"],
)
def test_the_test_vectors_through_a_live_request(attach, chat, sae_id, features, digest, clamped):
    attach(sae_id, d_sae=2048, layer=1)
    response = chat(steering={"sae_id": sae_id, "features": [{"index": i, "strength": s} for i, s in features]})
    assert response.status_code == 200, response.text
    [(kind, params)] = members(response.headers["x-millm-steering"])
    applied = sum(1 for _, s in features if s != 0)
    assert kind == "inline"
    assert params == {
        "sae": sae_id,
        "layer": 1,
        "features": applied,
        "hash": digest,
        **({"clamped": clamped} if clamped else {}),
    }


def test_no_steering_says_none(chat, attach):
    assert chat().headers["x-millm-steering"] == "none"
    attach("sae-a")
    response = chat()
    assert response.headers["x-millm-steering"] == "none"
    assert "x-millm-steering-intensity" not in response.headers
    assert "millm" not in response.json() and "millm_steering" not in response.json()


def test_manual_active_and_request_profiles(client, attach, chat):
    attach("sae-a")
    client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 7, "strength": 2.0}]})
    [(kind, params)] = members(chat().headers["x-millm-steering"])
    assert kind == "manual" and params["hash"] == spec_hash("sae-a", [(7, 2.0)])
    assert list(params) == ["sae", "layer", "features", "hash"]

    client.post(
        "/api/profiles",
        json={
            "name": "calm",
            "sae_id": "sae-a",
            "features": [{"index": 1, "strength": 150.0}, {"index": 2, "strength": -3}],
        },
    )
    client.post("/api/profiles", json={"name": "loud", "sae_id": "sae-a", "features": [{"index": 9, "strength": 5}]})
    client.post("/api/profiles/calm/activate").raise_for_status()
    [(kind, params)] = members(chat().headers["x-millm-steering"])
    assert (kind, str(params["source"]), params["name"], params["intensity"]) == ("profile", "active", "calm", "1.0")
    assert params["hash"] == spec_hash("sae-a", [(1, 150.0), (2, -3.0)]) and "clamped" not in params

    response = chat(profile="loud")
    [(kind, params)] = members(response.headers["x-millm-steering"])
    assert (kind, str(params["source"]), params["name"]) == ("profile", "request", "loud")
    assert params["hash"] == spec_hash("sae-a", [(9, 5.0)])
    # the request's profile applied to that request only
    assert members(chat().headers["x-millm-steering"])[0][1]["name"] == "calm"

    dialled = chat(steering_intensity=1.5)
    [(kind, params)] = members(dialled.headers["x-millm-steering"])
    assert params["intensity"] == "1.5" and params["clamped"] == 1  # 150 × 1.5 is clamped to 200
    assert params["hash"] == spec_hash("sae-a", [(1, 150.0), (2, -3.0)], 1.5)
    assert dialled.headers["x-millm-steering-intensity"] == '"1.5"'


@pytest.mark.parametrize(("dial", "lam"), [(0.25, 0.25), ("min", 0.5), ("max", 2.0), (2, 2.0)])
def test_the_dial_scales_live_values_and_is_echoed(client, attach, chat, dial, lam):
    attach("sae-a")
    client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 7, "strength": 2.0}]})
    response = chat(steering_intensity=dial)
    assert float(members(response.headers["x-millm-steering-intensity"])[0][0]) == lam
    assert members(response.headers["x-millm-steering"])[0][1]["hash"] == spec_hash("sae-a", [(7, 2.0)], lam)


def test_off_disables_steering_without_validating_the_base(client, attach, chat, sae_dir):
    attach("sae-a")
    client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 7, "strength": 2.0}]})
    response = chat(steering_intensity="off")
    assert response.headers["x-millm-steering"] == "none"
    assert response.headers["x-millm-steering-intensity"] == '"0.0"'
    client.post("/api/saes", json={"path": str(sae_dir("sae-b")), "sae_id": "sae-b"})
    client.post(
        "/api/profiles", json={"name": "elsewhere", "sae_id": "sae-b", "features": [{"index": 1, "strength": 1}]}
    )
    assert_error(chat(profile="elsewhere", steering_intensity=0.01), 400, "SAE_NOT_ATTACHED", "profile")
    response = chat(profile="elsewhere", steering_intensity=0)
    assert response.status_code == 200 and response.headers["x-millm-steering"] == "none"


def test_profile_refusals_and_no_sae(client, chat, attach, sae_dir):
    assert_error(chat(profile="nope"), 404, "profile_not_found", "profile")
    assert_error(chat(profile=""), 400, "invalid_parameter", "profile")
    client.post("/api/saes", json={"path": str(sae_dir("sae-b")), "sae_id": "sae-b"})
    client.post("/api/profiles", json={"name": "b", "sae_id": "sae-b", "features": [{"index": 1, "strength": 1}]})
    response = chat(profile="b", steering_intensity=0.5)  # no SAE attached: unsteered, no echo
    assert response.status_code == 200 and response.headers["x-millm-steering"] == "none"
    assert "x-millm-steering-intensity" not in response.headers
    attach("sae-a")
    message = assert_error(chat(profile="b"), 400, "SAE_NOT_ATTACHED", "profile")["message"]
    assert "sae-b" in message and "(sae-a, layer 0)" in message


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"steering_intensity": 2.5}, "invalid_parameter", "steering_intensity"),
        ({"steering_intensity": "high"}, "invalid_parameter", "steering_intensity"),
        ({"steering_intensity": True}, "invalid_parameter", "steering_intensity"),
        ({"steering": {"features": []}, "profile": "p"}, "invalid_parameter", "steering, profile"),
        ({"steering": {"features": []}, "steering_intensity": 1}, "invalid_parameter", "steering, steering_intensity"),
        ({"steering": [1]}, "invalid_parameter", "steering"),
        ({"steering": {}}, "invalid_parameter", "steering.features"),
        ({"steering": {"features": [], "sae_id": "sae-a"}}, "invalid_parameter", "steering.sae_id"),
        (
            {"steering": {"features": [{"index": 256, "strength": 1}]}},
            "INVALID_FEATURE_INDEX",
            "steering.features[0].index",
        ),
        ({"steering": {"features": [{"index": -1, "strength": 1}]}}, "invalid_parameter", "steering.features[0].index"),
        (
            {"steering": {"features": [{"index": 1.5, "strength": 1}]}},
            "invalid_parameter",
            "steering.features[0].index",
        ),
        (
            {"steering": {"features": [{"index": 1, "strength": 1}, {"index": 1, "strength": 2}]}},
            "invalid_parameter",
            "steering.features[1].index",
        ),
        (
            {"steering": {"features": [{"index": 1, "strength": True}]}},
            "invalid_parameter",
            "steering.features[0].strength",
        ),
        (
            {"steering": {"features": [{"index": 1, "strength": "8"}]}},
            "invalid_parameter",
            "steering.features[0].strength",
        ),
        ({"steering": {"features": [{"index": 1}]}}, "invalid_parameter", "steering.features[0].strength"),
        (
            {"steering": {"sae_id": "other", "features": [{"index": 1, "strength": 1}]}},
            "SAE_NOT_ATTACHED",
            "steering.sae_id",
        ),
    ],
)
def test_inline_refusals(attach, chat, fields, code, param):
    attach("sae-a")
    assert_error(chat(**fields), 400, code, param)


def test_inline_needs_an_attached_sae_and_a_resident_model(client, chat, attach):
    assert_error(chat(steering={"features": [{"index": 1, "strength": 1}]}), 400, "SAE_NOT_ATTACHED")
    assert chat(steering={"features": []}).headers["x-millm-steering"] == "none"
    attach("sae-a")
    resident = client.get("/api/health").json()["model"]
    other = next(m["id"] for m in client.get("/v1/models").json()["data"] if m["id"] != resident)
    assert_error(chat(model=other, steering={"features": [{"index": 1, "strength": 1}]}), 400, "SAE_NOT_ATTACHED")
    assert client.get("/api/health").json()["model"] == resident  # refused before any load


def test_inline_selection_names_each_candidate(attach, chat):
    attach("sae-a")
    attach("sae-a", layer=1)
    message = assert_error(
        chat(steering={"features": [{"index": 1, "strength": 1}]}), 400, "invalid_parameter", "steering.sae_id"
    )["message"]
    assert "(sae-a, layer 0)" in message and "(sae-a, layer 1)" in message
    assert_error(
        chat(steering={"sae_id": "sae-a", "features": [{"index": 1, "strength": 1}]}), 400, "invalid_parameter"
    )
    response = chat(steering={"sae_id": "sae-a", "layer": 1, "features": [{"index": 1, "strength": 1}]})
    assert members(response.headers["x-millm-steering"])[0][1]["layer"] == 1


def test_inline_replaces_everything_live_and_the_empty_set_unsteers(client, attach, chat):
    attach("sae-a")
    attach("sae-b", layer=1)
    client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 7, "strength": 2.0}]})
    client.put("/api/steering", json={"sae_id": "sae-b", "features": [{"index": 8, "strength": 2.0}]})
    assert [k for k, _ in members(chat().headers["x-millm-steering"])] == ["manual", "manual"]
    inline = members(
        chat(steering={"sae_id": "sae-b", "features": [{"index": 3, "strength": 1}]}).headers["x-millm-steering"]
    )
    assert [(k, p["sae"]) for k, p in inline] == [("inline", "sae-b")]
    assert chat(steering={"features": []}).headers["x-millm-steering"] == "none"
    epoch = client.get("/api/steering").json()["epoch"]
    chat(steering={"sae_id": "sae-b", "features": [{"index": 3, "strength": 1}]})
    assert client.get("/api/steering").json()["epoch"] == epoch  # inline steering never moves the epoch
    assert client.get("/api/profiles").json()["data"] == []


def test_unknown_nested_fields_are_reported(attach, chat):
    attach("sae-a")
    response = chat(steering={"features": [{"index": 1, "strength": 1, "note": "x"}], "why": 1})
    assert response.status_code == 200
    assert {name for name, _ in members(response.headers["x-millm-ignored-fields"])} == {
        "steering.features[0].note",
        "steering.why",
    }


def test_text_completions_and_several_prompts(attach, chat):
    attach("sae-a")
    response = chat(
        "/v1/completions", prompt=["One", "Two", "Three"], steering={"features": [{"index": 4, "strength": 6.0}]}
    )
    assert response.status_code == 200 and len(response.json()["choices"]) == 3
    [(kind, params)] = members(response.headers["x-millm-steering"])
    assert kind == "inline" and params["hash"] == spec_hash("sae-a", [(4, 6.0)])


def test_a_stream_says_its_steering_on_the_finish_chunk(client, attach, model_id):
    def stream(**fields):
        body = {
            "model": model_id,
            "max_tokens": 3,
            "temperature": 0,
            "stream": True,
            "messages": [{"role": "user", "content": "Hi"}],
            **fields,
        }
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
            return response.headers, lines

    headers, lines = stream()
    assert "x-millm-steering" not in headers
    assert lines[-1] == "[DONE]" and json.loads(lines[-2])["millm_steering"] == "none"
    assert json.loads(lines[-2])["choices"][0]["finish_reason"] is not None
    assert all(json.loads(line)["choices"] for line in lines[:-1])  # no choice-less chunk

    attach("sae-a")
    client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 7, "strength": 2.0}]})
    headers, lines = stream(steering_intensity=0.5)
    assert headers["x-millm-steering-intensity"] == '"0.5"' and "x-millm-steering" not in headers
    final = json.loads(lines[-2])
    assert final["object"] == "chat.completion.chunk" and final["choices"][0]["finish_reason"] is not None
    [(kind, params)] = members(final["millm_steering"])
    assert kind == "manual" and params["hash"] == spec_hash("sae-a", [(7, 2.0)], 0.5)


def _long_stream(client, model_id, change, **fields):
    """Stream a long greedy completion (hundreds of forward passes); run ``change()`` once the first token arrived."""
    body = {"model": model_id, "max_tokens": 400, "temperature": 0, "stream": True, "prompt": "The", **fields}
    with client.stream("POST", "/v1/completions", json=body) as response:
        lines = []
        for line in response.iter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
                if len(lines) == 1:
                    change()
    return members(json.loads(lines[-2])["millm_steering"])


def test_an_operator_change_mid_request_wins_and_is_flagged(server, attach):
    """Live requests take the operator's new values; frozen ones keep theirs; both say ``changed``."""
    with server.http() as client, server.http() as operator:
        model_id = client.get("/api/health").json()["model"]
        attach("sae-a")
        operator.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 7, "strength": 2.0}]})

        def put(strength):
            return lambda: operator.put(
                "/api/steering", json={"sae_id": "sae-a", "features": [{"index": 7, "strength": strength}]}
            ).raise_for_status()

        [(kind, params)] = _long_stream(client, model_id, put(3.0))
        assert kind == "manual" and params["changed"] is True
        assert params["hash"] == spec_hash("sae-a", [(7, 3.0)])  # the state at the end, as applied

        [(kind, params)] = _long_stream(
            client, model_id, put(4.0), steering={"features": [{"index": 1, "strength": 1.0}]}
        )
        assert kind == "inline" and params["changed"] is True
        assert params["hash"] == spec_hash("sae-a", [(1, 1.0)])
        live = operator.get("/api/steering").json()["manual"][0]
        assert live["live"] and live["features"] == [{"index": 7, "strength": 4.0}]  # never reverted

        [(kind, params)] = _long_stream(client, model_id, lambda: operator.delete("/api/steering"))
        assert (kind, params) == ("none", {"changed": True})
