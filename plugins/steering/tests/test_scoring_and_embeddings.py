"""Scoring requests and embeddings are never steered, and scoring refuses the steering fields.

The scoring and embeddings endpoints are built elsewhere; these tests drive the
plugin's hooks with the contexts those paths build (``ctx.scoring`` set by the
host, the ``embeddings`` endpoint), so the guarantees hold whichever path calls them.
"""

from __future__ import annotations

import pytest

from millm_host.context import RequestContext
from millm_host.engine import ModelDescriptor
from millm_host.errors import FieldNotHonoured
from millm_host.settings import Settings
from millm_steering import plugin, request


def context(endpoint="completions", scoring=True, **body):
    return RequestContext(endpoint=endpoint, body={"model": "m", **body}, params=None, headers={},
                          model=ModelDescriptor("m", "/m", "hf", "transformers"), engine_name="transformers",
                          settings=Settings(environ={}), scoring=scoring)


@pytest.mark.parametrize("field", ["profile", "steering_intensity", "steering", "return_sae_activations"])
@pytest.mark.parametrize("endpoint", ["completions", "chat.completions"])
def test_scoring_requests_refuse_steering_fields(field, endpoint):
    value = {"steering": {"features": []}, "return_sae_activations": {}}.get(field, "x")
    with pytest.raises(FieldNotHonoured) as err:
        request.validate(context(endpoint, logprobs=2, **{field: value}), service=None)
    assert err.value.param == field and err.value.status == 400


def test_scoring_and_embeddings_install_nothing_and_carry_the_right_header():
    scoring = context()
    assert request.hooks(scoring, service=None) is None
    assert plugin.render_headers(scoring) == {"X-miLLM-Steering": "none"}
    assert plugin.response_extras(scoring) is None
    embeddings = context("embeddings", scoring=False, input="hello")
    request.validate(embeddings, service=None)
    assert request.hooks(embeddings, service=None) is None
    assert plugin.render_headers(embeddings) is None and plugin.response_extras(embeddings) is None
