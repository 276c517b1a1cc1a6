"""k-sparse probes: features of an SAE (standard, jumprelu, topk) read through the same path."""

from __future__ import annotations

import pytest

TOLERANCE = 1e-4
CHAT = [{"role": "user", "content": "Which birds migrate the furthest?"}]


@pytest.mark.parametrize("architecture,k", [("standard", None), ("jumprelu", None), ("topk", 12)])
def test_sae_basis_scores_match_independent_encoding(api, lab, identity, model_id, helpers, sae_dir, architecture, k):
    sae_id = f"tests--probe-llama--{architecture}"
    lab.make_sae(sae_dir, sae_id, architecture=architecture, k=k, seed=len(architecture))
    features = [3, 17, 40, 41, 77, 90]
    doc = lab.definition(
        identity,
        name=f"sparse-{architecture}",
        rule="max",
        windows=["all", "prompt"],
        sae={"sae_id": sae_id, "feature_indices": features},
        seed=11,
    )
    probe = helpers.import_probe(api, doc)
    armed = helpers.arm(api, probe["id"])  # parity passed: the recorded scores reproduce
    assert armed["parity"]["status"] == "passed"

    body = api.post(
        "/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 3, "temperature": 0}
    ).json()
    prompt = lab.chat_ids(CHAT)
    generated = lab.greedy(prompt, 3)
    fed = prompt + (generated[:-1] if len(generated) == 3 else generated)
    results = {r["window"]: r for r in body["millm_probe_verdicts"]}
    assert abs(results["all"]["score"] - lab.score(doc, fed)) <= TOLERANCE
    assert abs(results["prompt"]["score"] - lab.score(doc, fed, 0, len(prompt))) <= TOLERANCE
    offline = api.post(
        "/api/probes/score", json={"probe_ids": [probe["id"]], "windows": ["all"], "inputs": [{"messages": CHAT}]}
    ).json()
    assert abs(offline["results"][0]["results"][0]["score"] - lab.score(doc, prompt)) <= TOLERANCE


def test_a_missing_sae_fails_as_encoder_failed(api, lab, identity, helpers):
    doc = lab.definition(
        identity, name="sparse-missing", vectors=0, sae={"sae_id": "not-on-disk", "feature_indices": [1, 2]}
    )
    probe = helpers.import_probe(api, doc)
    [result] = api.post("/api/probes/score", json={"probe_ids": [probe["id"]], "inputs": [{"text": "x"}]}).json()[
        "results"
    ][0]["results"]
    assert (result["outcome"], result["reason"]) == ("failed", "encoder_failed")
    refused = api.post(f"/api/probes/{probe['id']}/arm", json={})
    assert refused.status_code == 409 and refused.json()["error"]["gate"] == "parity"
