"""Fixtures the transformers engine's batching tests share."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from .test_batching import load


@pytest.fixture(scope="module")
def serial(tiny_model_dir):
    """The tiny random Llama on the serial path: what a batched row is compared against."""
    engine = load(tiny_model_dir, MILLM_BATCHING="serial")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def tiny_app(app_factory, tiny_model_dir) -> Callable[..., object]:
    """``tiny_app(plugins=(...), **env)``: the app in this process serving the tiny random Llama with this
    engine and ``plugins`` besides (real HTTP on a loopback port, no process to start), its settings from ``env``."""

    def start(plugins: tuple[str, ...] = (), **env: str) -> object:
        return app_factory(plugins=["engine_transformers", *plugins], checkpoint=tiny_model_dir, env=env)

    return start
