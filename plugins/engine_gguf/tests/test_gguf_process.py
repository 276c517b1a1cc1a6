"""The GGUF engine as the server holds it: ``ProcessEngine``, llama.cpp in a child process.

Called directly here: the conformance suite (on the batched default,
``GGUF_PARALLEL=4``), the same answers as the
in-process engine, a crash while loading, a restart that fails and then
succeeds, and a child that always ends with its engine. The server-level
crash tests are in ``test_gguf_crash.py``.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

from millm_engine_gguf.engine import GGUFEngine
from millm_engine_gguf.process import Child, EngineCrashed, ProcessEngine
from millm_engine_gguf.spec import SPEC, describe
from millm_host.engine import SamplingParams, resolve
from millm_host.errors import ContextLengthExceeded, FieldNotHonoured, ModelLoadFailed
from millm_host.testing.conformance import EngineConformance, take

from .test_gguf_crash import alive, wait_for
from .test_gguf_engine import settings

MESSAGES = [{"role": "user", "content": "Count to ten."}]
GREEDY = SamplingParams(max_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def engine(gguf_path):
    engine = ProcessEngine.load(
        describe(str(gguf_path)), settings(GGUF_N_CTX="256", GGUF_N_BATCH="128"), lambda _: None
    )
    yield engine
    engine.close()


def test_the_server_loads_gguf_models_into_a_child_process():
    assert resolve(SPEC.factory) is ProcessEngine


def test_the_same_model_and_tokens_as_in_process(engine, gguf_path):
    local = GGUFEngine.load(describe(str(gguf_path)), settings(GGUF_N_CTX="256", GGUF_N_BATCH="128"), lambda _: None)
    try:
        assert engine.info == local.info
        assert engine.embedding_window == local.embedding_window
        ids = engine.chat_ids(MESSAGES)
        assert ids == local.chat_ids(MESSAGES)
        assert take(engine, ids, GREEDY, 12) == take(local, ids, GREEDY, 12)
        assert engine.embed(ids) == local.embed(ids)
    finally:
        local.close()


def test_refusals_from_the_child_keep_their_class_and_fields(engine):
    with pytest.raises(FieldNotHonoured) as caught:
        engine.embed([1, 2], "last")  # refused in the child, by the in-process engine's own check
    assert (caught.value.status, caught.value.param) == (400, "pooling")
    with pytest.raises(ContextLengthExceeded) as caught:
        engine.embed([28120] * 129)
    assert caught.value.param == "input" and "128" in caught.value.message
    assert take(engine, engine.chat_ids(MESSAGES), GREEDY, 2)  # and the child still serves


@pytest.mark.parametrize("signum", [signal.SIGILL, signal.SIGABRT], ids=["SIGILL", "SIGABRT"])
def test_a_crash_mid_generation_fails_that_generation_only(engine, signum):
    ids = engine.chat_ids(MESSAGES)
    expected = take(engine, ids, GREEDY, 4)
    before = engine.status()
    tokens = engine.generate(ids, SamplingParams(max_tokens=200, temperature=0))
    next(tokens)
    os.kill(before["pid"], signum)
    with pytest.raises(EngineCrashed) as caught:
        list(tokens)
    assert signum.name in caught.value.message and caught.value.code == "engine_crashed"
    assert take(engine, ids, GREEDY, 4) == expected  # waits for the restart
    after = engine.status()
    assert (after["restarts"], after["last_signal"]) == (before["restarts"] + 1, signum.name)


@pytest.fixture(scope="module")
def serial_engine(gguf_path):
    """The engine with GGUF_PARALLEL=1: one generation at a time."""
    engine = ProcessEngine.load(
        describe(str(gguf_path)), settings(GGUF_N_CTX="256", GGUF_N_BATCH="128", GGUF_PARALLEL="1"), lambda _: None
    )
    yield engine
    engine.close()


def test_an_abandoned_stream_is_stopped_before_the_next_request(serial_engine):
    engine = serial_engine
    ids = engine.chat_ids(MESSAGES)
    expected = take(engine, ids, GREEDY, 12)
    abandoned = engine.generate(ids, SamplingParams(max_tokens=200, temperature=0))
    assert next(abandoned) == expected[0]
    assert engine.status()["generating"]
    assert take(engine, ids, GREEDY, 12) == expected  # never reads the abandoned stream's tokens
    assert list(abandoned) == [] and not engine.status()["generating"]


def test_a_crash_while_loading_is_model_load_failed(gguf_path, monkeypatch):
    monkeypatch.setattr(Child, "command", (sys.executable, "-c", "import os, signal; os.abort()"))
    with pytest.raises(ModelLoadFailed) as caught:
        ProcessEngine.load(describe(str(gguf_path)), settings(), lambda _: None)
    assert caught.value.code == "model_load_failed" and "SIGABRT" in caught.value.message


def test_a_failed_restart_answers_503_until_one_succeeds(gguf_path, tmp_path):
    path = tmp_path / "Restart-Model-Q4_1.gguf"
    path.symlink_to(gguf_path)
    engine = ProcessEngine.load(describe(str(path)), settings(GGUF_ENABLE_EMBEDDINGS="false"), lambda _: None)
    try:
        ids = engine.chat_ids(MESSAGES)
        expected = take(engine, ids, GREEDY, 4)
        path.unlink()  # the restart cannot load it
        os.kill(engine.status()["pid"], signal.SIGSEGV)
        failed = wait_for(lambda: (s := engine.status())["state"] == "failed" and s, "the restart fails")
        assert failed["last_signal"] == "SIGSEGV" and "does not exist" in failed["last_error"]
        with pytest.raises(EngineCrashed) as caught:
            take(engine, ids, GREEDY, 4)
        assert caught.value.status == 503 and int(caught.value.headers["Retry-After"]) >= 1
        path.symlink_to(gguf_path)  # the next attempt (backing off) loads it
        wait_for(lambda: engine.status()["state"] == "running", "a later restart succeeds")
        assert take(engine, ids, GREEDY, 4) == expected
        assert engine.status()["restarts"] == 1
    finally:
        engine.close()


def test_close_ends_the_child(gguf_path):
    engine = ProcessEngine.load(describe(str(gguf_path)), settings(GGUF_ENABLE_EMBEDDINGS="false"), lambda _: None)
    pid = engine.status()["pid"]
    assert alive(pid)
    engine.close()
    assert not alive(pid) and engine.status()["state"] == "closed"
    engine.close()  # once is enough; twice is harmless


class TestProcessEngineConformance(EngineConformance):
    """The shared engine conformance suite, across the process boundary."""

    supports_seed = False

    @pytest.fixture
    def engine(self, engine):
        return engine
