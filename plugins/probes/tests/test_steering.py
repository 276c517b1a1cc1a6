"""With the steering plugin installed: steering never changes what a probe reads.

A probe reads the residual before any steering at every layer up to its own: at the steered
point it reads before the write; downstream of one, the request's tokens are read again,
unsteered, in one pass with the probes' reads alone (``unsteered_pass_ms`` in the request's
report), so a live score equals the stateless scoring of the same text. Stateless scoring is
unsteered.
"""

from __future__ import annotations

import pytest

pytest.importorskip("millm_steering")

CHAT = [{"role": "user", "content": "Describe a mountain at dawn."}]
SAE_ID = "probe-steer-sae"


@pytest.fixture
def steered(api, lab, identity, helpers, sae_dir):
    """An SAE attached at layer 1's output, and probes at that point and one layer later."""
    layers = {"at-steering": 1, "after-steering": 2}
    docs = [lab.definition(identity, name=name, layer=layer, windows=["prompt"]) for name, layer in layers.items()]
    with helpers.attached_sae(api, lab, sae_dir, SAE_ID, layer=1, seed=21), helpers.armed(api, docs) as ids:
        yield dict(zip(layers, ids, strict=True))
        api.delete("/api/steering")


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
    report = api.get("/api/probes/status").json()["last_request"]
    # Read at the steered point, before the write: the same number. One layer on, steering changed
    # the residual (by more than 1e-2 before probes read it again), and the probe reads it unsteered.
    assert steered_scores["at-steering"] == pytest.approx(plain["at-steering"], abs=1e-6)
    assert steered_scores["after-steering"] == pytest.approx(plain["after-steering"], abs=1e-4)
    assert report["unsteered_pass_ms"] > 0  # what it cost: one pass over the request's tokens
    assert (
        pushed.json()["choices"][0]["message"]
        != api.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    )  # the reply itself is steered


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
    # Live traffic is steered (at layer 1), but the probe one layer on reads it unsteered: the
    # stateless scoring of the same prompt, which is unsteered however the operator steers.
    assert live["after-steering"] == pytest.approx(before, abs=1e-4)
    assert offline()["results"][0]["results"][0]["score"] == before


def test_what_counts_as_a_write_upstream_of_a_read():
    """Only another plugin's write, and only one before the read point in the pass."""
    from millm_host.api import ORDER_READ_POST_STEERING, ORDER_WRITE_STEERING, LayerHook
    from millm_probes.serving.live import writes_upstream

    def write(layer, point, owner="steering", order=ORDER_WRITE_STEERING):
        return LayerHook(layer, point, lambda hidden, start: None, order, owner)

    reads = [(3, "resid_post")]
    assert writes_upstream([write(2, "resid_post")], reads)  # an earlier layer
    assert writes_upstream([write(3, "resid_pre")], reads)  # the layer's input, under a read of its output
    assert not writes_upstream([write(3, "resid_post")], reads)  # the read's own point: probes read first
    assert not writes_upstream([write(4, "resid_pre")], reads)  # after the read
    assert not writes_upstream([write(1, "resid_post", order=ORDER_READ_POST_STEERING)], reads)  # a read
    assert not writes_upstream([write(1, "resid_post", owner="probes")], reads)  # the probes' own hooks
    assert not writes_upstream([], reads)


def test_a_failed_unsteered_pass_fails_the_results_not_the_request(api, model_id, steered, monkeypatch):
    """No steered score stands in for an unsteered one: if the pass fails, the results say so."""
    from millm_probes.serving import live

    def fails(*args, **kwargs):
        raise RuntimeError("out of memory (test)")

    monkeypatch.setattr(live, "forward_columns", fails)
    inline = {"sae_id": SAE_ID, "features": [{"index": 3, "strength": 120.0}]}
    body = {"model": model_id, "messages": CHAT, "max_tokens": 2, "temperature": 0, "steering": inline}
    response = api.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    results = response.json()["millm_probe_verdicts"]
    assert {(r["outcome"], r["reason"], r["score"]) for r in results} == {("failed", "unsteered_pass_failed", None)}
