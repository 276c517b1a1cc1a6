"""The served GGUF engine tokenizes on the host's text thread: one chat leaves the event loop twice.

``ProcessEngine`` keeps llama.cpp's model in a child process and only a vocabulary-only load
here, so its text methods run beside a generation (``concurrent_text``). Before, a GGUF chat
took four hand-offs (a worker, the engine thread, a worker, the engine thread). An unload
waits for a tokenizing still under way before it frees that vocabulary.
"""

from __future__ import annotations

import threading

import pytest

from millm_engine_gguf.loader import load_vocabulary
from millm_engine_gguf.vocab import Vocab
from millm_host.api import ModelNotLoaded
from millm_host.testing import chat
from millm_host.testing.hops import Recorder, count_dispatches

from .conftest import N_CTX, THREADS


def test_one_gguf_chat_takes_two_hand_offs(app_factory, gguf_path, monkeypatch):
    recorder = Recorder()
    app = app_factory(
        plugins=["engine_gguf"],
        models={},
        model=str(gguf_path),
        env={"MILLM_ENGINE": "gguf", "GGUF_N_CTX": str(N_CTX), **THREADS},
        register=[recorder],
    )
    assert app.host.registry.engine.concurrent_text
    dispatched = count_dispatches(monkeypatch, app.host.scheduler)
    with app.http() as http:
        reply = chat(http, app.health()["model"], max_tokens=3)
    assert reply.status_code == 200, reply.text
    assert dispatched == ["run_text", "submit_beside"], dispatched  # GGUF_PARALLEL: a generation's own thread
    assert recorder.threads_off_the_loop() == ["millm-text", "millm-generation"], recorder.calls


def test_freeing_the_vocabulary_waits_for_a_read_under_way(gguf_path):
    """As ``GGUFTextEngine.close_text`` frees it: ``retire``, then the model."""
    model = load_vocabulary(str(gguf_path))
    vocab = Vocab(model.model)
    freed = threading.Event()
    closer = threading.Thread(target=lambda: (vocab.retire(), model.close(), freed.set()))
    with vocab.in_use():  # a tokenizing under way on the text thread
        closer.start()
        assert not freed.wait(0.3), "the vocabulary was freed under a read"
    closer.join(10)
    assert freed.is_set()
    with pytest.raises(ModelNotLoaded):
        vocab.tokenize(b"after the unload", True)
