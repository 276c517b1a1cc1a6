"""Steering is h ← h + Σ s·W_dec[i] at the hook point, checked against transformers directly.

The server's residual is read through an "identity" SAE (W_enc = [I, -I], no
bias): its activations are relu(h) and relu(-h), so h = a[:d] - a[d:] exactly.
The reference is transformers' own forward (output_hidden_states) on the same
checkpoint, plus the decoder rows summed here with numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

D = 64


@pytest.fixture(scope="module")
def reference_model(tiny_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def hidden_after_layer0(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[1][0].double().numpy()  # the output of decoder layer 0


def identity_tensors():
    eye = np.eye(D, dtype=np.float32)
    return {
        "W_enc": np.concatenate([eye, -eye], axis=1),
        "b_enc": np.zeros(2 * D, np.float32),
        "W_dec": np.concatenate([eye, -eye], axis=0),
        "b_dec": np.zeros(D, np.float32),
    }


def residuals(response_json):
    """(token ids, residual rows) read through the identity SAE, position by position."""
    positions = response_json["millm"]["sae_activations"]["positions"]
    assert [p["position"] for p in positions] == list(range(len(positions)))
    rows = np.zeros((len(positions), D))
    for row, position in zip(rows, positions, strict=True):
        for feature in position["features"]:
            index, value = feature["index"], feature["value"]
            row[index % D] += value if index < D else -value
    return [p["token_id"] for p in positions], rows


def test_the_residual_is_shifted_by_the_decoder_rows(client, attach, sae_dir, model_id, reference_model):
    attach("steer", d_sae=256, seed=3)
    attach("identity", d_sae=2 * D, tensors=identity_tensors())
    features = [(3, 5.0), (17, -2.5), (200, 0.75)]
    w_dec = load_file(str(sae_dir("steer") / "sae_weights.safetensors"))["W_dec"].astype(np.float64)
    delta = sum(s * w_dec[i] for i, s in features)

    for read_point, expected_shift in (("pre_steering", 0.0), ("post_steering", delta)):
        response = client.post(
            "/v1/chat/completions",
            json={
                "model": model_id,
                "max_tokens": 6,
                "temperature": 0,
                "messages": [{"role": "user", "content": "Tell me about the sea"}],
                "steering": {"sae_id": "steer", "features": [{"index": i, "strength": s} for i, s in features]},
                "return_sae_activations": {
                    "sae_id": "identity",
                    "top_k": D,
                    "positions": "all",
                    "read_point": read_point,
                },
            },
        )
        assert response.status_code == 200, response.text
        ids, served = residuals(response.json())
        assert len(ids) == response.json()["usage"]["total_tokens"] - 1  # the last token is never fed back
        expected = hidden_after_layer0(reference_model, ids) + expected_shift
        np.testing.assert_allclose(served, expected, atol=1e-5, rtol=0)


def test_sae_activations_match_an_independent_encoding(client, attach, sae_dir, model_id, reference_model):
    attach("reader", d_sae=96, seed=5)
    weights = {
        k: v.astype(np.float64) for k, v in load_file(str(sae_dir("reader") / "sae_weights.safetensors")).items()
    }
    response = client.post(
        "/v1/completions",
        json={
            "model": model_id,
            "prompt": "A quiet harbour at dawn",
            "max_tokens": 3,
            "temperature": 0,
            "return_sae_activations": {"positions": "prompt", "top_k": 5, "features": list(range(0, 96, 2))},
        },
    )
    activations = response.json()["millm"]["sae_activations"]
    ids = [p["token_id"] for p in activations["positions"]]
    acts = np.maximum(hidden_after_layer0(reference_model, ids) @ weights["W_enc"] + weights["b_enc"], 0)
    for position, row in zip(activations["positions"], acts, strict=True):
        candidates = sorted(((row[i], i) for i in range(0, 96, 2) if row[i] > 0), reverse=True)[:5]
        assert [f["index"] for f in position["features"]] == [i for _, i in candidates]
        np.testing.assert_allclose([f["value"] for f in position["features"]], [v for v, _ in candidates], atol=1e-5)


def test_a_strong_feature_changes_greedy_output(client, attach, model_id):
    body = {"model": model_id, "max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
    plain = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    attach("steer", d_sae=256, seed=3)
    steered = client.post(
        "/v1/chat/completions", json={**body, "steering": {"features": [{"index": 11, "strength": 60.0}]}}
    ).json()
    assert steered["choices"][0]["message"]["content"] != plain


def test_attached_but_unsteered_is_byte_identical(client, attach, model_id):
    body = {"model": model_id, "max_tokens": 24, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
    before = client.post("/v1/chat/completions", json=body)
    attach("steer", d_sae=256, seed=3)
    attach("steer", layer=1)
    after = client.post("/v1/chat/completions", json=body)
    empty = client.post("/v1/chat/completions", json={**body, "steering": {"features": []}})
    zero = client.post(
        "/v1/chat/completions",
        json={**body, "steering": {"features": [{"index": 2, "strength": 0.0}], "sae_id": "steer", "layer": 1}},
    )

    def content(response):
        choice = response.json()["choices"][0]
        return choice["message"]["content"], choice["finish_reason"], response.json()["usage"]

    assert content(after) == content(empty) == content(zero) == content(before)
    assert zero.headers["x-millm-steering"] == "none"  # a zero strength is no feature
