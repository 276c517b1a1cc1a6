"""Fixtures: tiny models carrying each tool-call family's chat template, and one server for them all.

A tiny random model writes nothing useful by itself: the test-only
``scripted_output`` plugin makes it write a given reply
(``X-Test-Scripted-Output``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .family import FAMILY_MODELS


@pytest.fixture(scope="session")
def family_models(tmp_path_factory) -> Path:
    """A models directory: one tiny random Llama per template, named by family."""
    from millm_host.testing.tiny_models import tiny_llama

    folder = tmp_path_factory.mktemp("family-models")
    for name, template in FAMILY_MODELS.items():
        os.symlink(tiny_llama(name=name, chat_template=template), folder / name)
    return folder


@pytest.fixture(scope="session")
def family_server(app_factory, family_models):
    """One app for every family model (each loads on demand), scripted output enabled.

    In-process (``AppServer``), with every installed plugin and the transformers engine.
    """
    return app_factory(
        shared=True,
        plugins="all",
        models={},
        model="tiny-qwen25",
        env={"MILLM_MODELS_DIR": str(family_models), "SCRIPTED_OUTPUT_ENABLED": "true"},
    )
