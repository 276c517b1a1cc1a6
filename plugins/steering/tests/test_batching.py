"""Steering inside a continuous batch (``MILLM_BATCHING=continuous``): each row its own vector.

Concurrent requests, half steered (each with its own features) and half not, all
reading their residual through the identity SAE, get what they get one at a time
on the serial server: the same text, the same ``X-miLLM-Steering``, the same
residual (1e-5), and they were served in the batch, not on the serial fallback.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from .conftest import MAX_ENTRIES, reset
from .test_correctness import D, identity_tensors, residuals

PROMPTS = ["Tell me about the sea", "Hi", "A long walk through the old town at night", "Why?"]
FEATURES = [[(3, 5.0), (17, -2.5)], None, [(200, 8.0)], None]


@pytest.fixture(scope="module")
def batching_server(app_factory, tiny_model_dir, sae_root):
    return app_factory(
        plugins="all",
        models={},
        model=str(tiny_model_dir),
        env={
            "SAE_ACTIVATIONS_MAX_ENTRIES": str(MAX_ENTRIES),
            "MILLM_SAE_DIRS": str(sae_root),
            "MILLM_BATCHING": "continuous",
            "MILLM_PREFILL_CHUNK": "5",  # the prompts prefill over several passes
        },
    )


def prepare(server, sae_dir) -> None:
    with server.http() as client:
        reset(client)
        for sae_id, kwargs in (("steer", {"d_sae": 256, "seed": 3}), ("identity", {"d_sae": 2 * D})):
            if sae_id == "identity":
                kwargs["tensors"] = identity_tensors()
            path = sae_dir(sae_id, **kwargs)
            client.post("/api/saes", json={"path": str(path), "sae_id": sae_id}).raise_for_status()
            client.post(f"/api/saes/{sae_id}/attach", json={}).raise_for_status()


def body(model, prompt, features):
    request = {
        "model": model,
        "max_tokens": 8,
        "temperature": 0,
        "messages": [{"role": "user", "content": prompt}],
        "return_sae_activations": {"sae_id": "identity", "top_k": D, "positions": "all", "read_point": "post_steering"},
    }
    if features is not None:
        request["steering"] = {"sae_id": "steer", "features": [{"index": i, "strength": s} for i, s in features]}
    return request


def answer(response):
    assert response.status_code == 200, response.text
    payload = response.json()
    return payload["choices"][0]["message"]["content"], response.headers["x-millm-steering"], residuals(payload)


def test_steered_and_plain_rows_share_the_batch_each_with_its_own_vector(steering_server, batching_server, sae_dir):
    prepare(steering_server, sae_dir)
    prepare(batching_server, sae_dir)
    with steering_server.http() as client:
        model = client.get("/api/health").json()["model"]
        want = [
            answer(client.post("/v1/chat/completions", json=body(model, p, f)))
            for p, f in zip(PROMPTS, FEATURES, strict=True)
        ]
    got: list = [None] * len(PROMPTS)
    barrier = threading.Barrier(len(PROMPTS))

    def work(index):
        with batching_server.http() as client:
            barrier.wait()
            got[index] = answer(client.post("/v1/chat/completions", json=body(model, PROMPTS[index], FEATURES[index])))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for (text, header, (ids, rows)), (want_text, want_header, (want_ids, want_rows)) in zip(got, want, strict=True):
        assert (text, header, ids) == (want_text, want_header, want_ids)
        np.testing.assert_allclose(rows, want_rows, atol=1e-5, rtol=0)
    assert want[0][1] != "none" and want[1][1] == "none"
    with batching_server.http() as client:
        report = client.get("/api/health/inference").json()
        reset(client)
    with steering_server.http() as client:
        reset(client)
    assert report["backend"] == "continuous"
    assert report["batched"] >= len(PROMPTS) and report["serial_reasons"] == {}


def test_one_batched_add_steers_each_row_with_its_own_vector_and_leaves_the_others():
    """The row map, without a server: ``steer_rows`` adds each listed row its vector, the rest exactly nothing."""
    import torch

    from millm_host.api import HookRow, LayerHook
    from millm_steering.plan import steer_rows

    class FrozenPlan:  # what steer_rows asks of a request's plan
        live = False

        def delta(self, slot):
            return slot

    plan = FrozenPlan()
    hidden = torch.randn(4, 3, 5)

    def hook(vector):
        return LayerHook(0, "resid_post", lambda h, s: h + vector, batched=steer_rows, state=(plan, vector))

    one, three = torch.randn(5), torch.randn(5)
    rows = [HookRow(1, 0, 0, hook(one)), HookRow(3, 0, 2, hook(three))]
    out = steer_rows(hidden, rows)
    assert torch.equal(out[0], hidden[0]) and torch.equal(out[2], hidden[2])
    assert torch.equal(out[1], hidden[1] + one) and torch.equal(out[3], hidden[3] + three)
    assert steer_rows(hidden, [HookRow(1, 0, 0, hook(None))]) is None  # nothing to add: no new tensor
    again = steer_rows(hidden, rows)  # the same rows and vectors: the stack is reused
    assert torch.equal(again, out)


#: What each concurrent request reads through the 256-feature SAE: every positions kind, a
#: feature restriction, both read points.
READS = [
    {"sae_id": "steer", "top_k": 6, "positions": "all"},
    {"sae_id": "steer", "positions": "last"},
    {"sae_id": "steer", "features": [1, 2, 3, 50, 100, 201], "top_k": 3, "positions": "completion",
     "read_point": "pre_steering"},
    {"sae_id": "steer", "top_k": 4, "positions": {"start": 2, "end": 9}},
]  # fmt: skip


def activations(response):
    assert response.status_code == 200, response.text
    return response.json()["millm"]["sae_activations"]


def test_batched_sae_activations_equal_serial_ones(steering_server, batching_server, sae_dir, monkeypatch):
    """``return_sae_activations`` read in the batch (``read_rows``, one call per pass) equals serial within 1e-5."""
    from millm_steering import activations as reader_module

    prepare(steering_server, sae_dir)
    prepare(batching_server, sae_dir)
    widths = []  # how many rows each batched read got (the apps run in this process)
    read_rows = reader_module.read_rows

    def counted(hidden, rows):
        widths.append(len(rows))
        return read_rows(hidden, rows)

    monkeypatch.setattr(reader_module, "read_rows", counted)

    def request(model, index):
        return {**body(model, PROMPTS[index], FEATURES[index]), "return_sae_activations": READS[index]}

    with steering_server.http() as client:
        model = client.get("/api/health").json()["model"]
        want = [activations(client.post("/v1/chat/completions", json=request(model, i))) for i in range(len(READS))]
    got: list = [None] * len(READS)
    barrier = threading.Barrier(len(READS))

    def work(index):
        with batching_server.http() as client:
            barrier.wait()
            got[index] = activations(client.post("/v1/chat/completions", json=request(model, index)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(READS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for batched, alone in zip(got, want, strict=True):
        assert batched["read_point"] == alone["read_point"]
        assert [(p["position"], p["token_id"]) for p in batched["positions"]] == [
            (p["position"], p["token_id"]) for p in alone["positions"]
        ]
        assert alone["positions"]
        for mine, theirs in zip(batched["positions"], alone["positions"], strict=True):
            assert [f["index"] for f in mine["features"]] == [f["index"] for f in theirs["features"]]
            np.testing.assert_allclose(
                [f["value"] for f in mine["features"]], [f["value"] for f in theirs["features"]], atol=1e-5, rtol=0
            )
    with batching_server.http() as client:
        report = client.get("/api/health/inference").json()
        reset(client)
    with steering_server.http() as client:
        reset(client)
    assert report["serial_reasons"] == {}
    assert max(widths) > 1  # some passes read several requests' rows in one call
