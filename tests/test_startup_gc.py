"""The garbage collector is held off while the server starts, and on again once the start model is loaded.

``millm serve`` holds it from its first line (``bodies.collector.hold_startup``): without the
hold, importing torch, transformers and the plugins ran eight full collections, a
third of a warm start (``bench/warm_start.py``). These tests take the hold as
``millm serve`` does and start the app in process.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from millm_host.bodies import collector as gcpause
from millm_host.testing import AppServer


@pytest.fixture
def held() -> Iterator[None]:
    """The start-up hold taken as ``millm serve`` takes it; the collector restored whatever the test does."""
    assert gc.isenabled()
    gcpause.hold_startup()
    try:
        yield
    finally:
        gcpause.end_startup()
        gc.enable()
        gc.unfreeze()  # the start-up froze this test process's objects too


def test_the_collector_is_back_on_once_the_start_model_is_loaded(held, tmp_path):
    assert not gc.isenabled()
    with AppServer(tmp_path) as app:
        assert app.health()["status"] == "ok"
        assert gc.isenabled()


def test_the_start_up_load_freezes_without_a_full_collection(held, tmp_path):
    """A full pass over everything the start-up imported is what the hold saves; the load only freezes."""
    full: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    gc.callbacks.append(count)
    try:
        with AppServer(tmp_path) as app:
            assert app.health()["status"] == "ok"
            assert gc.get_freeze_count() > 0
    finally:
        gc.callbacks.remove(count)
    assert full == []


def test_a_later_load_collects_before_it_freezes(tmp_path):
    with AppServer(tmp_path, models={"echo": {}, "echo-2": {}}) as app:
        full: list[int] = []

        def count(phase: str, info: dict) -> None:
            if phase == "start" and info["generation"] == 2:
                full.append(1)

        gc.callbacks.append(count)
        try:
            app.http().post("/api/models/echo-2/load").raise_for_status()
        finally:
            gc.callbacks.remove(count)
        assert full
    gc.unfreeze()


def test_the_collector_is_back_on_when_no_model_loads_on_start(held, tmp_path):
    with AppServer(tmp_path, env={"MILLM_LOAD_ON_START": "false"}, wait_for=None):
        assert gc.isenabled()


def test_the_collector_is_back_on_when_the_start_model_fails(held, tmp_path):
    with AppServer(tmp_path, models={"echo": {"load_error": "no weights"}}, wait_for=None) as app:
        assert app.health()["status"] != "ok"
        assert gc.isenabled()


def test_a_body_parsed_while_starting_does_not_turn_the_collector_on_early(held):
    with gcpause.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # still starting
    gcpause.end_startup()
    assert gc.isenabled()
    gcpause.end_startup()  # once only: a second end changes nothing
    with gcpause.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_that_was_off_before_stays_off():
    gc.disable()
    try:
        gcpause.hold_startup()
        gcpause.end_startup()
        assert not gc.isenabled()
    finally:
        gc.enable()
