"""Scoring requests and embeddings are never steered, and scoring refuses the steering fields.

The header and body hooks are also driven with the contexts the scoring and
embeddings paths build (``ctx.scoring`` set by the host, the ``embeddings``
endpoint), so what they render holds whichever path calls them.
"""

from __future__ import annotations

import pytest

from millm_host.api import FieldNotHonoured, ModelDescriptor, RequestContext, Settings
from millm_host.testing import assert_error
from millm_steering import plugin, request


def context(endpoint="completions", scoring=True, **body):
    return RequestContext(
        endpoint=endpoint,
        body={"model": "m", **body},
        params=None,
        headers={},
        model=ModelDescriptor("m", "/m", "hf", "transformers"),
        engine_name="transformers",
        settings=Settings(environ={}),
        scoring=scoring,
    )


def test_scoring_and_embeddings_carry_the_right_header():
    scoring = context()
    assert plugin.render_headers(scoring) == {"X-miLLM-Steering": "none"}
    assert plugin.response_extras(scoring) is None
    embeddings = context("embeddings", scoring=False, input="hello")
    request.validate(embeddings, service=None)
    assert plugin.render_headers(embeddings) is None and plugin.response_extras(embeddings) is None


# --- end to end, through the real endpoints ---------------------------------------------------


def _steer_hard(client, attach, model_id):
    """Attach a SAE and set strong live values: generation is visibly steered."""
    attach("e2e-sae", d_sae=64, seed=3)
    client.put(
        "/api/steering", json={"sae_id": "e2e-sae", "features": [{"index": i, "strength": 150.0} for i in range(8)]}
    ).raise_for_status()


def test_embeddings_are_identical_under_active_steering(client, attach, model_id):
    body = {"model": model_id, "input": ["steer me not", "second input"], "encoding_format": "float"}
    before = client.post("/v1/embeddings", json=body)
    _steer_hard(client, attach, model_id)
    chat = client.post(
        "/v1/chat/completions",
        json={"model": model_id, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
    )
    assert chat.headers["x-millm-steering"].startswith("manual;")
    after = client.post("/v1/embeddings", json=body)
    assert before.status_code == after.status_code == 200
    assert [d["embedding"] for d in after.json()["data"]] == [d["embedding"] for d in before.json()["data"]]
    assert "x-millm-steering" not in after.headers


def test_scoring_is_identical_under_active_steering(client, attach, model_id):
    body = {"model": model_id, "prompt": "The answer is", "max_tokens": 1, "logprobs": 5}
    before = client.post("/v1/completions", json=body)
    _steer_hard(client, attach, model_id)
    after = client.post("/v1/completions", json=body)
    assert before.status_code == after.status_code == 200
    assert after.json()["choices"][0]["logprobs"] == before.json()["choices"][0]["logprobs"]
    assert after.headers["x-millm-steering"] == "none"
    chat_body = {
        "model": model_id,
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": 3,
        "messages": [{"role": "user", "content": "Hello"}],
    }
    chat = client.post("/v1/chat/completions", json=chat_body)
    assert chat.status_code == 200 and chat.headers["x-millm-steering"] == "none"


SCORING_BODIES = {
    "completions": {"prompt": "x", "max_tokens": 1, "logprobs": 2},
    "chat.completions": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "logprobs": True},
}


@pytest.mark.parametrize(
    "field,value", [("profile", "anything"), ("steering_intensity", 1.0), ("steering", {"features": []})]
)
@pytest.mark.parametrize("endpoint", ["completions", "chat.completions"])
def test_scoring_requests_carrying_steering_fields_are_400_through_the_server(client, model_id, endpoint, field, value):
    body = {"model": model_id, **SCORING_BODIES[endpoint], field: value}
    assert_error(client.post("/v1/" + endpoint.replace(".", "/"), json=body), 400, FieldNotHonoured.code, field)
