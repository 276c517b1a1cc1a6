"""``GGUF_PARALLEL`` > 1: the child decodes several generations together (``batch``, ``parallel``).

Called directly, as ``test_gguf_process.py`` does: concurrent greedy generations
against the serial engine's, a closed stream freeing its row, a request that
must run alone, embeddings between steps, and a crash under several generations.
"""

from __future__ import annotations

import os
import signal
import threading

import httpx
import numpy as np
import pytest

from millm_engine_gguf.engine import GGUFEngine
from millm_engine_gguf.parallel import ParallelEngine
from millm_engine_gguf.process import EngineCrashed, ProcessEngine
from millm_engine_gguf.spec import describe
from millm_host.engine import SamplingParams
from millm_host.testing.conformance import take

from .test_gguf_engine import settings

PROMPTS = ["Count to ten.", "What is the capital of France?", "Write a haiku about rain.", "Say hello."]
TOKENS = 16
GREEDY = SamplingParams(max_tokens=TOKENS, temperature=0)
OPTIONS = {"GGUF_N_CTX": "256", "GGUF_N_BATCH": "128"}


@pytest.fixture(scope="module")
def engine(gguf_path):
    engine = ProcessEngine.load(describe(str(gguf_path)), settings(GGUF_PARALLEL="4", **OPTIONS), lambda _: None)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def serial(gguf_path):
    engine = GGUFEngine.load(describe(str(gguf_path)), settings(**OPTIONS), lambda _: None)
    yield engine
    engine.close()


def ids_of(engine, prompt):
    return engine.chat_ids([{"role": "user", "content": prompt}])


def concurrently(engine, prompts, params=GREEDY):
    """Each prompt's tokens, all generated at once (a thread each, as the host runs them)."""
    results: dict[int, list[int]] = {}

    def run(i: int) -> None:
        results[i] = take(engine, ids_of(engine, prompts[i]), params, params.max_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)  # a guard against a hang, not a timing assertion
    return [results.get(i) for i in range(len(prompts))]


def test_parallel_mode_is_a_batching_engine(engine):
    assert isinstance(engine, ParallelEngine) and engine.concurrent_generation
    report = engine.inference()
    assert (report["backend"], report["max_rows"]) == ("continuous", 4)


def test_greedy_rows_one_at_a_time_equal_serial_ones(engine, serial):
    for prompt in PROMPTS:
        assert take(engine, ids_of(engine, prompt), GREEDY, TOKENS) == take(
            serial, ids_of(serial, prompt), GREEDY, TOKENS
        )


def test_concurrent_greedy_rows_leave_the_serial_answer_only_at_a_tie(engine, serial):
    """Batched kernels sum in another order, so a batched row may break a tie the other way.

    Measured here: every divergence falls where the serial logits of the two best tokens are
    equal (to float32), and before it the row equals its serial answer token for token.
    """
    expected = [take(serial, ids_of(serial, prompt), GREEDY, TOKENS) for prompt in PROMPTS]
    for prompt, want, got in zip(PROMPTS, expected, concurrently(engine, PROMPTS), strict=True):
        assert got is not None and len(got) == TOKENS
        split = next((k for k in range(TOKENS) if got[k] != want[k]), None)
        if split is not None:
            gap = top_two_gap(serial, ids_of(serial, prompt) + want[:split])
            assert gap <= 1e-3, (prompt, split, gap)


def top_two_gap(engine, ids):
    """The serial logit gap between the two best next tokens after ``ids``."""
    llm = engine.llm
    llm.reset()
    llm.eval(ids)
    logits = np.sort(np.array(llm.scores[llm.n_tokens - 1]))
    llm.reset()
    return float(logits[-1] - logits[-2])


def test_a_closed_stream_frees_its_row(gguf_path):
    engine = ProcessEngine.load(describe(str(gguf_path)), settings(GGUF_PARALLEL="2", **OPTIONS), lambda _: None)
    try:
        long = SamplingParams(max_tokens=200, temperature=0)
        first, second = (engine.generate(ids_of(engine, p), long) for p in PROMPTS[:2])
        next(first), next(second)
        first.close()  # both rows were taken: a third generation runs only once this row is free
        assert len(take(engine, ids_of(engine, PROMPTS[2]), GREEDY, TOKENS)) == TOKENS
        assert next(second) is not None
        second.close()
    finally:
        engine.close()


def test_penalties_run_alone_with_the_serial_answer(engine, serial):
    params = SamplingParams(max_tokens=TOKENS, temperature=0, presence_penalty=1.5)
    expected = take(serial, ids_of(serial, PROMPTS[0]), params, TOKENS)
    before = engine.inference()["serial_reasons"].get("penalties", 0)
    results = concurrently(engine, PROMPTS[:1] * 2, params)
    assert results == [expected, expected]
    assert engine.inference()["serial_reasons"]["penalties"] == before + 2


def test_embeddings_are_answered_between_steps(engine, serial):
    ids = serial.tokenize("a short sentence")
    tokens = engine.generate(ids_of(engine, PROMPTS[0]), SamplingParams(max_tokens=200, temperature=0))
    next(tokens)
    assert engine.embed(ids) == pytest.approx(serial.embed(ids), abs=1e-5)
    tokens.close()


@pytest.mark.parametrize("signum", [signal.SIGABRT], ids=["SIGABRT"])
def test_a_crash_fails_every_generation_in_flight_and_the_child_restarts(engine, signum):
    ids = ids_of(engine, PROMPTS[0])
    expected = take(engine, ids, GREEDY, 4)
    before = engine.status()
    streams = [engine.generate(ids, SamplingParams(max_tokens=200, temperature=0)) for _ in range(2)]
    for stream in streams:
        next(stream)
    os.kill(before["pid"], signum)
    for stream in streams:
        with pytest.raises(EngineCrashed):
            list(stream)
    assert take(engine, ids, GREEDY, 4) == expected  # waits for the restart
    assert engine.status()["restarts"] == before["restarts"] + 1


def test_a_parallel_server_answers_concurrent_chats_and_reports_its_batch(server_factory, gguf_path):
    server = server_factory(
        model=gguf_path,
        env={"GGUF_PARALLEL": "4", "GGUF_N_CTX": "256", "GGUF_N_THREADS": "1", "GGUF_N_THREADS_BATCH": "1"},
        args=["--engine", "gguf"],
    )
    with httpx.Client(base_url=server.base_url, timeout=300) as client:
        model = client.get("/api/health").json()["model"]

        def chat(prompt: str, **extra) -> str:
            body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8, **extra}
            response = client.post("/v1/chat/completions", json={"temperature": 0, **body})
            response.raise_for_status()
            return response.json()["choices"][0]["message"]["content"]

        answers: dict[int, str] = {}
        threads = [threading.Thread(target=lambda i=i: answers.update({i: chat(PROMPTS[i])})) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert all(answers.get(i) for i in range(4))
        assert chat(PROMPTS[0], presence_penalty=1.0)
        report = client.get("/api/health/inference").json()
    assert (report["backend"], report["max_rows"], report["batched"]) == ("continuous", 4, 4)
    assert report["serial_reasons"] == {"penalties": 1}
