"""A batch row's draw (``sampling.draw``): the softmax at the temperature, cut to the ``top_p`` nucleus."""

from __future__ import annotations

import numpy as np
import pytest

from millm_engine_gguf.sampling import draw
from millm_host.api import SamplingParams

LOGITS = np.array([2.0, 1.0, 0.5, -1.0, 0.0], dtype=np.float32)
DRAWS = 20_000


def frequencies(params: SamplingParams, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.bincount([draw(LOGITS, params, rng) for _ in range(DRAWS)], minlength=len(LOGITS))
    return counts / DRAWS


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_without_a_nucleus_each_token_is_drawn_as_often_as_the_softmax_says(temperature):
    scaled = LOGITS.astype(np.float64) / temperature
    softmax = np.exp(scaled - scaled.max()) / np.exp(scaled - scaled.max()).sum()
    assert frequencies(SamplingParams(max_tokens=1, temperature=temperature, top_p=1.0)) == pytest.approx(
        softmax, abs=0.015
    )


def test_top_p_keeps_the_smallest_set_that_reaches_it_renormalised():
    probs = np.exp(LOGITS - LOGITS.max()) / np.exp(LOGITS - LOGITS.max()).sum()  # 0.53, 0.20, 0.12, 0.03, 0.07
    kept = probs[:2] / probs[:2].sum()  # 0.53 + 0.20 reaches 0.7: the two most likely
    expected = np.concatenate([kept, np.zeros(3)])
    assert frequencies(SamplingParams(max_tokens=1, temperature=1.0, top_p=0.7)) == pytest.approx(expected, abs=0.015)


def test_a_seed_draws_the_same_tokens_again():
    params = SamplingParams(max_tokens=1, temperature=1.0, top_p=1.0)
    first, again = (np.random.default_rng(7) for _ in range(2))
    assert [draw(LOGITS, params, first) for _ in range(50)] == [draw(LOGITS, params, again) for _ in range(50)]
