"""The example detector's batched read hook (``LayerHook.batched``) on the tiny model.

Concurrent chats on a continuous-batching server, each read through the one batched
function the detector shares between requests, report the residual norms they report
one at a time on a serial server (1e-4): the function kept each request to its rows.
"""

from __future__ import annotations

import pytest

from millm_host.testing import run_together

PROMPTS = ["Where do foxes live?", "Hi", "Name three rivers of Europe, please, and say why", "Why?"]
ENV = {"DETECTOR_EXAMPLE_ENABLED": "true", "DETECTOR_EXAMPLE_LAYER": "1"}


@pytest.fixture(scope="module")
def servers(app_factory, tiny_model_dir):
    plugins = ["engine_transformers", "detector_example"]
    serial = app_factory(plugins=plugins, checkpoint=tiny_model_dir, env=ENV)
    batched = app_factory(
        plugins=plugins,
        models={},
        model=str(tiny_model_dir),
        env={**ENV, "MILLM_BATCHING": "continuous", "MILLM_PREFILL_CHUNK": "5"},
    )
    return serial, batched


def norms(client, model, prompt):
    body = {"model": model, "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": prompt}]}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    payload = response.json()
    return payload["usage"], payload["detector_example"]["residual_norms"]


def test_each_batched_request_reads_its_own_rows(servers):
    serial, batched = servers
    with serial.http() as client:
        model = client.get("/api/health").json()["model"]
        want = [norms(client, model, prompt) for prompt in PROMPTS]
    got: list = [None] * len(PROMPTS)

    def work(index):
        with batched.http() as client:
            got[index] = norms(client, model, PROMPTS[index])

    run_together(work, len(PROMPTS))
    for (usage, values), (want_usage, want_values) in zip(got, want, strict=True):
        assert usage == want_usage
        # one norm per position the passes read: the prompt, then each generated token but the last
        assert len(values) == len(want_values) == usage["prompt_tokens"] + usage["completion_tokens"] - 1
        assert values == pytest.approx(want_values, rel=1e-4)
    with batched.http() as client:
        report = client.get("/api/health/inference").json()
    assert report["backend"] == "continuous" and report["batched"] >= len(PROMPTS)
