"""One OpenMP team in the process (``intraop``), and the engine's model work on the batch thread.

GNU OpenMP gives every thread that starts a parallel region a team of its own, and
once the teams' threads outnumber the CPUs it throttles them all (they sleep almost
at once between regions): the batch decoded 22% slower on 2 cores after one other
thread had run a parallel copy. So with batching on, the engine's other model work
(embeddings, scoring, a generation that runs alone) runs on the batch thread, and
threads that are not the model's compute on one thread and start no team.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from millm_host.api import LayerHook, SamplingParams, ScoringParams, Setting

from .test_batching import load, run


def native_threads() -> int:
    """Threads of this process that Python did not start: OpenMP team members (and other native pools)."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    force = Setting("PROBE_FORCE_SERIAL", bool, True, "")  # a probes hook makes a generation run alone
    engine = load(tiny_model_dir, force, MILLM_BATCHING="continuous")
    if engine.batch.intraop is None:
        engine.close()
        pytest.skip("one CPU, or a torch without OpenMP: there is one team anyway")
    yield engine
    engine.close()


def model_work(engine, prompt: list[int]) -> None:
    """Everything the engine does with the model: batched and alone, embeddings, scoring."""
    run(engine, prompt, SamplingParams(max_tokens=3, temperature=0))
    probe = LayerHook(0, "resid_post", lambda hidden, start: None, owner="probes")
    tokens = engine.generate(prompt, SamplingParams(max_tokens=3, temperature=0), hooks=[probe])
    list(tokens)
    engine.embed(prompt)
    engine.score_next_token([prompt], ScoringParams(top=3))


def test_the_batch_thread_has_every_core_and_other_threads_one(engine):
    assert engine.batch.call(torch.get_num_threads) == engine.batch.intraop.threads > 1
    with ThreadPoolExecutor(1) as pool:  # a thread started after the engine, as a plugin's would be
        assert pool.submit(torch.get_num_threads).result() == 1


def test_model_work_and_plugin_tensor_work_from_other_threads_start_no_team(engine):
    prompt = engine.tokenize("hello there, how are you")
    model_work(engine, prompt)  # the batch thread's team, and whatever else starts once
    before = native_threads()
    hold = threading.Event()
    done: list[threading.Event] = []

    def from_a_thread_that_stays(work) -> threading.Thread:
        finished = threading.Event()
        done.append(finished)

        def body() -> None:
            try:
                work()
            finally:
                finished.set()
            hold.wait()  # a team lives as long as the thread that started it

        thread = threading.Thread(target=body)
        thread.start()
        return thread

    workers = [
        from_a_thread_that_stays(lambda: model_work(engine, prompt)),
        # what a plugin does on an executor thread: an SAE's weights converted, a vocabulary-sized tensor
        from_a_thread_that_stays(lambda: torch.ones(4_000_000, dtype=torch.float64).to(torch.float32).mul_(2)),
    ]
    try:
        for finished in done:
            assert finished.wait(120)
        assert native_threads() == before
    finally:
        hold.set()
        for worker in workers:
            worker.join()


def test_a_generation_run_alone_stops_when_its_reader_closes_and_frees_the_batch(engine):
    prompt = engine.tokenize("hello there")
    eos = sorted(engine.info.eos_token_ids)
    forwards = []
    probe = LayerHook(0, "resid_post", lambda hidden, start: forwards.append(start), owner="probes")
    never_ends = SamplingParams(max_tokens=100_000, temperature=0, logit_bias={token: -100.0 for token in eos})
    tokens = engine.generate(prompt, never_ends, hooks=[probe])
    next(tokens)
    next(tokens)
    tokens.close()
    assert len(run(engine, prompt, SamplingParams(max_tokens=3, temperature=0))) == 3  # the batch is served
    assert len(forwards) < 100_000  # it stopped when its reader left, not at max_tokens
