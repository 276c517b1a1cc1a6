"""Fixtures the transformers engine's batching tests share."""

from __future__ import annotations

import pytest

from .test_batching import load


@pytest.fixture(scope="module")
def serial(tiny_model_dir):
    """The tiny random Llama on the serial path: what a batched row is compared against."""
    engine = load(tiny_model_dir, MILLM_BATCHING="serial")
    yield engine
    engine.close()
