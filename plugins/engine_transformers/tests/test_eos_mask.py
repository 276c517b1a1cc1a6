"""``SamplingParams.min_tokens`` (vLLM's ``min_tokens``, and ``ignore_eos``): EOS masked, alone and in the batch."""

from __future__ import annotations

import pytest

from millm_host.api import SamplingParams
from millm_host.testing.conformance import take

from .test_batching import load


@pytest.fixture(scope="module")
def continuous(tiny_model_dir):
    engine = load(tiny_model_dir, MILLM_BATCHING="continuous")
    yield engine
    engine.close()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("path", ["serial", "continuous"])
def test_eos_is_masked_from_the_first_min_tokens_draws(request, path, temperature):
    engine = request.getfixturevalue(path)
    eos = min(engine.info.eos_token_ids)
    ids = engine.chat_ids([{"role": "user", "content": "hi"}])
    forced = {eos: 100.0}  # EOS is every draw's choice, but for the mask
    params = SamplingParams(max_tokens=8, temperature=temperature, seed=1, logit_bias=forced, min_tokens=3)
    tokens = take(engine, ids, params, 4)
    assert not set(tokens[:3]) & engine.info.eos_token_ids
    assert tokens[3] == eos
    assert take(engine, ids, SamplingParams(max_tokens=8, temperature=temperature, seed=1, logit_bias=forced), 1) == [
        eos
    ]
