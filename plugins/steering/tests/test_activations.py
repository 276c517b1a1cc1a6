"""return_sae_activations: positions, candidates, top_k, read points, limits and refusals."""

from __future__ import annotations

import json

import pytest
import transformers

from millm_host.testing import assert_error


@pytest.fixture
def ask(client, model_id, attach):
    """``ask(activations, **fields)``: a 4-token greedy text completion with one SAE attached."""
    attach("reader", d_sae=96)

    def send(activations, **fields):
        body = {
            "model": model_id,
            "prompt": "The lighthouse keeper",
            "max_tokens": 4,
            "temperature": 0,
            "return_sae_activations": activations,
            **fields,
        }
        return client.post("/v1/completions", json=body)

    return send


def read(response):
    assert response.status_code == 200, response.text
    return response.json()["millm"]["sae_activations"]


def test_positions(ask):
    response = ask({"positions": "all"})
    full = read(response)
    usage_prompt = response.json()["usage"]["prompt_tokens"]
    positions = [p["position"] for p in full["positions"]]
    assert positions == list(range(usage_prompt + 3))  # 4 generated, the last never fed back
    assert full["sae_id"] == "reader" and full["layer"] == 0 and full["read_point"] == "post_steering"
    assert full["note"].startswith("post_steering is what the model computed")
    by_position = {p["position"]: p for p in full["positions"]}

    def positions_of(spec):
        return [p["position"] for p in read(ask({"positions": spec}))["positions"]]

    assert positions_of("prompt") == list(range(usage_prompt))
    assert positions_of("completion") == [usage_prompt, usage_prompt + 1, usage_prompt + 2]
    assert positions_of("last") == [usage_prompt + 2]
    assert positions_of({"start": 2, "end": 5}) == [2, 3, 4]
    assert positions_of({"start": usage_prompt + 1, "end": 10_000}) == [usage_prompt + 1, usage_prompt + 2]
    assert read(ask({"positions": "last"}))["positions"][0] == by_position[usage_prompt + 2]


def test_token_ids_are_prompt_then_generated(ask, client, model_id, tiny_model_dir):
    response = ask({"positions": "all"})
    ids = [p["token_id"] for p in read(response)["positions"]]
    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    again = client.post(
        "/v1/completions", json={"model": model_id, "prompt": ids[:prompt_tokens], "max_tokens": 4, "temperature": 0}
    ).json()
    assert again["choices"][0]["text"] == response.json()["choices"][0]["text"]
    generated = transformers.AutoTokenizer.from_pretrained(tiny_model_dir).decode(ids[prompt_tokens:])
    assert response.json()["choices"][0]["text"].startswith(generated) and generated


def test_candidates_and_top_k(ask):
    everything = read(ask({"positions": "prompt", "top_k": 64}))
    restricted = read(ask({"positions": "prompt", "features": [5, 6, 7, 50], "top_k": 2}))
    for full, narrow in zip(everything["positions"], restricted["positions"], strict=False):
        values = [f["value"] for f in narrow["features"]]
        assert len(values) <= 2 and values == sorted(values, reverse=True) and all(v > 0 for v in values)
        assert {f["index"] for f in narrow["features"]} <= {5, 6, 7, 50}
        expected = sorted((f for f in full["features"] if f["index"] in {5, 6, 7, 50}), key=lambda f: -f["value"])[:2]
        assert narrow["features"] == expected
    default = read(ask({"positions": "last"}))["positions"][0]["features"]
    assert 0 < len(default) <= 8  # top_k defaults to 8


def test_read_points_around_this_layers_steering(ask):
    steering = {"features": [{"index": 1, "strength": 40.0}]}
    pre = read(ask({"positions": "prompt", "read_point": "pre_steering"}, steering=steering))
    post = read(ask({"positions": "prompt", "read_point": "post_steering"}, steering=steering))
    plain = read(ask({"positions": "prompt"}))
    assert pre["positions"] == plain["positions"] and pre["note"].startswith("pre_steering")
    assert post["positions"] != plain["positions"]


def test_a_stream_sends_activations_and_steering_on_the_finish_chunk(client, model_id, ask):
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "temperature": 0,
        "stream": True,
        "return_sae_activations": {"positions": "completion"},
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    final = json.loads(lines[-2])
    assert lines[-1] == "[DONE]"
    assert final["choices"][0]["finish_reason"] is not None and set(final["millm"]) == {"sae_activations"}
    assert len(final["millm"]["sae_activations"]["positions"]) == 2
    assert final["millm_steering"] == "none"
    assert not any("millm" in json.loads(line) or "millm_steering" in json.loads(line) for line in lines[:-2])


@pytest.mark.parametrize(
    ("activations", "fields", "code", "param"),
    [
        ({"top_k": 65}, {}, "invalid_parameter", "return_sae_activations.top_k"),
        ({"top_k": 0}, {}, "invalid_parameter", "return_sae_activations.top_k"),
        ({"features": [96]}, {}, "INVALID_FEATURE_INDEX", "return_sae_activations.features[0]"),
        ({"features": [3, 3]}, {}, "invalid_parameter", "return_sae_activations.features"),
        ({"positions": "middle"}, {}, "invalid_parameter", "return_sae_activations.positions"),
        ({"positions": {"start": 4, "end": 4}}, {}, "invalid_parameter", "return_sae_activations.positions"),
        ({"read_point": "unsteered"}, {}, "invalid_parameter", "return_sae_activations.read_point"),
        ({"sae_id": "absent"}, {}, "SAE_NOT_ATTACHED", "return_sae_activations.sae_id"),
        ("yes", {}, "invalid_parameter", "return_sae_activations"),
        ({}, {"n": 2}, "invalid_parameter", "n"),
        ({}, {"prompt": ["one", "two"]}, "invalid_parameter", "prompt"),
        ({"positions": "all", "top_k": 64}, {"max_tokens": 400}, "invalid_parameter", "return_sae_activations"),
        (
            {"positions": {"start": 0, "end": 10**6}, "top_k": 64},
            {"max_tokens": 400},
            "invalid_parameter",
            "return_sae_activations",
        ),
    ],
)
def test_refusals(ask, activations, fields, code, param):
    assert_error(ask(activations, **fields), 400, code, param)


def test_refusals_that_name_candidates_or_need_one_axis(client, model_id, attach):
    body = {
        "model": model_id,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "Hi"}],
        "return_sae_activations": {},
    }
    assert_error(client.post("/v1/chat/completions", json=body), 400, "SAE_NOT_ATTACHED")
    attach("reader", d_sae=96)
    attach("reader", layer=1)
    error = client.post("/v1/chat/completions", json=body).json()["error"]
    assert "(reader, layer 0)" in error["message"] and "(reader, layer 1)" in error["message"]
    layered = client.post("/v1/chat/completions", json={**body, "return_sae_activations": {"layer": 1}})
    assert layered.json()["millm"]["sae_activations"]["layer"] == 1
    rows = client.post(
        "/v1/chat/completions",
        json={**body, "return_sae_activations": {"layer": 1}, "extra_messages": [[{"role": "user", "content": "Yo"}]]},
    )
    assert rows.json()["error"]["param"] == "extra_messages"


# --- scoring requests: activations of the unsteered forward ------------------------------------


def _score(client, model_id, activations, **fields):
    body = {
        "model": model_id,
        "prompt": "The lighthouse keeper",
        "max_tokens": 1,
        "logprobs": 3,
        "return_sae_activations": activations,
        **fields,
    }
    return client.post("/v1/completions", json=body)


def test_scoring_reads_activations_reported_unsteered(ask, client, model_id):
    generated = read(ask({"positions": "prompt", "read_point": "pre_steering"}))
    response = _score(client, model_id, {"positions": "all"})
    scored = read(response)
    assert scored["read_point"] == "unsteered" and scored["note"].startswith("a scoring request")
    assert response.headers["x-millm-steering"] == "none"
    # The scoring forward is the prompt alone: its activations are the prompt's, unsteered.
    assert scored["positions"] == generated["positions"]
    assert read(_score(client, model_id, {"positions": "completion"}))["positions"] == []
    assert response.json()["choices"][0]["logprobs"]["top_logprobs"]


def test_scoring_activations_ignore_live_steering(ask, client, model_id):
    before = read(_score(client, model_id, {"positions": "prompt", "top_k": 16}))
    client.put(
        "/api/steering", json={"sae_id": "reader", "features": [{"index": 3, "strength": 120.0}]}
    ).raise_for_status()
    steered_chat = client.post("/v1/completions", json={"model": model_id, "prompt": "x", "max_tokens": 1})
    assert steered_chat.headers["x-millm-steering"].startswith("manual;")
    response = _score(client, model_id, {"positions": "prompt", "top_k": 16})
    assert read(response) == before and response.headers["x-millm-steering"] == "none"


def test_chat_scoring_reads_activations(ask, client, model_id):
    body = {
        "model": model_id,
        "max_tokens": 1,
        "logprobs": True,
        "messages": [{"role": "user", "content": "Hi"}],
        "return_sae_activations": {"positions": "last"},
    }
    response = client.post("/v1/chat/completions", json=body)
    scored = read(response)
    assert scored["read_point"] == "unsteered" and len(scored["positions"]) == 1
    assert scored["positions"][0]["position"] == response.json()["usage"]["prompt_tokens"] - 1


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"scoring_precision": "float32"}, "scoring_precision"),
    ],
)
def test_scoring_activation_refusals(ask, client, model_id, fields, param):
    response = _score(client, model_id, {"positions": "all"}, **fields)
    assert response.status_code == 400 and response.json()["error"]["param"] == param
