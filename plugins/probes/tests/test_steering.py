"""With the steering plugin installed: probes read the pre-steering residual, and stateless scoring is unsteered."""

from __future__ import annotations

import pytest

pytest.importorskip("millm_steering")

CHAT = [{"role": "user", "content": "Describe a mountain at dawn."}]
SAE_ID = "probe-steer-sae"


@pytest.fixture
def steered(api, lab, identity, helpers, sae_dir):
    """An SAE attached at layer 1's output, and probes at that point and one layer later."""
    lab.make_sae(sae_dir, SAE_ID, layer=1, seed=21)
    registered = api.post("/api/saes", json={"path": str(sae_dir / SAE_ID)})
    assert registered.status_code in (200, 201), registered.text
    assert api.post(f"/api/saes/{SAE_ID}/attach", json={}).status_code == 200
    probes = {}
    for name, layer in (("at-steering", 1), ("after-steering", 2)):
        probe = helpers.import_probe(api, lab.definition(identity, name=name, layer=layer, windows=["prompt"]))
        helpers.arm(api, probe["id"])
        probes[name] = probe["id"]
    yield probes
    api.delete("/api/steering")
    for probe_id in probes.values():
        api.post(f"/api/probes/{probe_id}/disarm")
    api.post(f"/api/saes/{SAE_ID}/detach", json={})
    api.delete(f"/api/saes/{SAE_ID}")


def prompt_scores(response) -> dict[str, float]:
    assert response.status_code == 200, response.text
    return {r["name"]: r["score"] for r in response.json()["millm_probe_verdicts"]}


def test_probes_read_the_residual_before_steering(api, model_id, steered):
    body = {"model": model_id, "messages": CHAT, "max_tokens": 2, "temperature": 0}
    plain = prompt_scores(api.post("/v1/chat/completions", json=body))
    inline = {"sae_id": SAE_ID, "features": [{"index": 3, "strength": 120.0}, {"index": 9, "strength": -80.0}]}
    pushed = api.post("/v1/chat/completions", json={**body, "steering": inline})
    assert pushed.headers["x-millm-steering"] != "none"
    steered_scores = prompt_scores(pushed)
    # Read at the steered point, before the write: the same number. One layer on, steering shows.
    assert steered_scores["at-steering"] == pytest.approx(plain["at-steering"], abs=1e-6)
    assert abs(steered_scores["after-steering"] - plain["after-steering"]) > 1e-2


def test_stateless_scoring_is_unsteered(api, model_id, steered):
    def offline():
        body = {"probe_ids": [steered["after-steering"]], "inputs": [{"messages": CHAT}]}
        return api.post("/api/probes/score", json=body).json()

    before = offline()["results"][0]["results"][0]["score"]
    live_values = api.put("/api/steering", json={"sae_id": SAE_ID, "features": [{"index": 3, "strength": 150.0}]})
    assert live_values.status_code == 200, live_values.text
    live = prompt_scores(
        api.post("/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 2, "temperature": 0})
    )
    assert abs(live["after-steering"] - before) > 1e-2  # live traffic is steered
    assert offline()["results"][0]["results"][0]["score"] == before  # scoring stored text is not
