"""The engine's tokenizer copies are pooled, not made per thread.

HF fast tokenizers are not safe to share between threads, so each call borrows a copy.
The server runs every request's generation on a thread of its own; a copy per thread
cost a deepcopy of the tokenizer per request (hundreds of milliseconds for SmolLM2's).
"""

from __future__ import annotations

import threading

from millm_host.api import ModelDescriptor, Settings


def test_requests_on_new_threads_reuse_the_pooled_copies(tiny_model_dir, monkeypatch):
    from millm_engine_transformers import engine as engine_module
    from millm_engine_transformers.engine import TransformersEngine

    descriptor = ModelDescriptor(id="tiny", path=str(tiny_model_dir), format="hf", engine="transformers")
    engine = TransformersEngine.load(descriptor, Settings(environ={}), lambda message: None)
    copies = []
    real = engine_module.copy.deepcopy
    monkeypatch.setattr(engine_module.copy, "deepcopy", lambda obj: copies.append(obj) or real(obj))
    want = engine.tokenize("the same words")
    got = []

    def request():  # one request's thread: tokenize, then decode token by token
        ids = engine.tokenize("the same words")
        got.append((ids, [engine.decode(ids[: i + 1]) for i in range(len(ids))]))

    for _ in range(4):  # one after another, each on a new thread
        thread = threading.Thread(target=request)
        thread.start()
        thread.join()
    assert copies == []  # the copy made at load served them all
    together = [threading.Thread(target=request) for _ in range(6)]
    for thread in together:
        thread.start()
    for thread in together:
        thread.join()
    assert len(copies) <= 5  # at most one more per thread that found every copy in use
    assert all(ids == want for ids, _ in got) and len({tuple(texts) for _, texts in got}) == 1
    engine.close()
