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


def test_the_pool_is_bounded_and_a_borrower_waits_for_a_copy_instead(tiny_model_dir, monkeypatch):
    """A copy holds the interpreter lock ~90 ms (SmolLM2's), which a running batch waits for: past
    ``TOKENIZER_COPIES`` the pool stops growing, and threads that find every copy in use wait."""
    from millm_engine_transformers import engine as engine_module
    from millm_engine_transformers.engine import TOKENIZER_COPIES, TransformersEngine

    descriptor = ModelDescriptor(id="tiny", path=str(tiny_model_dir), format="hf", engine="transformers")
    engine = TransformersEngine.load(descriptor, Settings(environ={}), lambda message: None)
    copies = []
    real = engine_module.copy.deepcopy
    monkeypatch.setattr(engine_module.copy, "deepcopy", lambda obj: copies.append(obj) or real(obj))
    start, borrowed, most = threading.Barrier(3 * TOKENIZER_COPIES), [0], [0]
    lock, every_copy_out = threading.Lock(), threading.Event()
    want = engine.tokenize("the same words")
    got = []

    def request():
        start.wait()
        with engine._tokenizer() as tokenizer:
            with lock:
                borrowed[0] += 1
                most[0] = max(most[0], borrowed[0])
                if borrowed[0] == TOKENIZER_COPIES:
                    every_copy_out.set()
            got.append(list(tokenizer("the same words")["input_ids"]))
            # hold it until every copy is out (however loaded the machine): the others find every copy in use
            every_copy_out.wait(30)
            with lock:
                borrowed[0] -= 1

    threads = [threading.Thread(target=request) for _ in range(3 * TOKENIZER_COPIES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert len(copies) == TOKENIZER_COPIES - 1  # the one made at load, and as many more as the bound allows
    assert most[0] == TOKENIZER_COPIES
    assert got == [want] * (3 * TOKENIZER_COPIES)
    engine.close()
