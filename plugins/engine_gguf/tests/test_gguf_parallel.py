"""``GGUF_PARALLEL`` > 1: the child decodes several generations together (``batch``, ``parallel``).

Called directly, as ``test_gguf_process.py`` does: concurrent greedy generations
against the serial engine's (equal to the bit), rows with penalties, logit_bias,
logprobs or min_tokens against the same request alone, a closed stream freeing its
row, a steered request that runs alone, embeddings between steps, and a crash under
several generations.
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
from millm_host.engine import GeneratedToken, SamplingParams
from millm_host.testing.conformance import take

from .test_gguf_engine import settings
from .test_gguf_steering import add

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


def test_concurrent_greedy_rows_equal_serial_ones(engine, serial):
    """Each row has its own KV cache and a step decodes each prompt chunk alone, so a row computes in a batch
    what it computes alone, to the bit."""
    expected = [take(serial, ids_of(serial, prompt), GREEDY, TOKENS) for prompt in PROMPTS]
    for _ in range(2):
        assert concurrently(engine, PROMPTS) == expected


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


YES, SUM = "Write the word yes five times.", "What is 2+2?"
#: Each with a prompt whose greedy answer it changes (logprobs: adds to).
SAMPLING_FIELDS = {
    "presence_penalty": (YES, {"presence_penalty": 2.0}),
    "frequency_penalty": (YES, {"frequency_penalty": 2.0}),
    "logit_bias": (SUM, {"logit_bias": {504: -100.0, 330: 5.0}}),
    "logprobs": (SUM, {"logprobs": 3}),
    "min_tokens": (SUM, {"min_tokens": TOKENS}),
}


def as_read(token) -> tuple:
    """A token with its logprobs, rounded to the float32 the wire carries them in."""
    if not isinstance(token, GeneratedToken):
        return (int(token),)
    return (
        int(token),
        float(np.float32(token.logprob)),
        [(t.token_id, float(np.float32(t.logprob))) for t in token.top],
    )


@pytest.mark.parametrize(("prompt", "fields"), SAMPLING_FIELDS.values(), ids=SAMPLING_FIELDS)
def test_a_row_with_sampling_fields_in_a_batch_equals_it_alone(engine, serial, prompt, fields):
    """Penalties, logit_bias, logprobs and min_tokens are sampled per row, beside plain rows."""
    params = SamplingParams(max_tokens=TOKENS, temperature=0, **fields)
    expected = [as_read(t) for t in take(serial, ids_of(serial, prompt), params, TOKENS)]
    assert expected != [as_read(t) for t in take(serial, ids_of(serial, prompt), GREEDY, TOKENS)]
    before = engine.inference()
    results: dict[int, list] = {}

    def run(i: int) -> None:
        row_params = params if i == 0 else GREEDY
        results[i] = take(engine, ids_of(engine, [prompt, *PROMPTS][i]), row_params, TOKENS)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [as_read(t) for t in results[0]] == expected
    after = engine.inference()
    assert after["batched"] == before["batched"] + 3 and after["serial_reasons"] == before["serial_reasons"]


def test_a_steered_generation_runs_alone_and_is_counted(engine, serial):
    hooks = [add(10, "resid_post", np.full(576, 4.0, dtype=np.float32))]
    ids = ids_of(engine, PROMPTS[1])
    expected = take(serial, ids, GREEDY, TOKENS, hooks=hooks)
    before = engine.inference()["serial_reasons"].get("steering", 0)
    assert take(engine, ids, GREEDY, TOKENS, hooks=hooks) == expected != take(serial, ids, GREEDY, TOKENS)
    assert engine.inference()["serial_reasons"]["steering"] == before + 1


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
    assert (report["backend"], report["max_rows"], report["batched"]) == ("continuous", 4, 5)
    assert report["serial_reasons"] == {}
