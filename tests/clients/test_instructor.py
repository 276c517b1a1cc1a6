"""instructor on the openai SDK: ``Mode.JSON_SCHEMA``, ``Mode.TOOLS`` and ``create_partial``."""

from __future__ import annotations

import instructor
import pytest

MODES = [instructor.Mode.JSON_SCHEMA, instructor.Mode.TOOLS]


@pytest.fixture(scope="module")
def patched(server):
    return lambda mode: instructor.from_openai(server.openai(), mode=mode)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_create(patched, model, shapes, mode):
    """One attempt (``max_retries=0``): the reply must validate the first time."""
    weather = patched(mode).chat.completions.create(
        model=model, messages=shapes.QUESTION, response_model=shapes.Weather, max_tokens=60, max_retries=0
    )
    assert isinstance(weather, shapes.Weather)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_create_partial(patched, model, shapes, mode):
    partials = list(
        patched(mode).chat.completions.create_partial(
            model=model, messages=shapes.QUESTION, response_model=shapes.Weather, max_tokens=60, max_retries=0
        )
    )
    assert partials
    last = partials[-1]
    assert last.city in ("Paris", "Rome") and isinstance(last.sunny, bool)
