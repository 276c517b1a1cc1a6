"""When a request joins the continuous batch, and how its first token is chosen.

A request that arrives while a long prompt prefills starts its own prefill at the
next step (the prefills of a step share one ``MILLM_PREFILL_CHUNK`` budget);
``MILLM_BATCH_GATHER_MS`` holds a first arrival back to share its prefill; plain
greedy rows take their tokens from one argmax over the batch.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from millm_host.api import LayerHook, SamplingParams

from .test_batching import concurrently, load, prompts, run, run_hooked

CHUNK = 7


@pytest.fixture(scope="module")
def batched(tiny_model_dir):
    engine = load(tiny_model_dir, MILLM_BATCHING="continuous", MILLM_PREFILL_CHUNK=str(CHUNK))
    yield engine
    engine.close()


def test_a_request_starts_its_prefill_at_the_next_step_beside_a_long_one(serial, batched, monkeypatch):
    scheduler = batched.batch
    ids = prompts(serial)
    long, short = ids[8], ids[0]  # 60 words: about nine chunks; one word
    params = SamplingParams(max_tokens=4, temperature=0)
    events: list[tuple] = []  # in the scheduler thread's order: steps, and each row's passes at layer 0
    stepped, resume = threading.Event(), threading.Event()
    real_step = scheduler._step

    def step():
        real_step()
        events.append(("step",))
        if not stepped.is_set():  # after the long prompt's first chunk: hold until the short one waits
            stepped.set()
            resume.wait(timeout=60)

    def recorder(name):
        return LayerHook(0, "resid_pre", lambda hidden, start: events.append((name, start, hidden.shape[1])))

    monkeypatch.setattr(scheduler, "_step", step)
    outputs: dict[str, list[int]] = {}

    def work(name, prompt):
        outputs[name] = run_hooked(batched, prompt, params, [recorder(name)])

    threads = {name: threading.Thread(target=work, args=(name, p)) for name, p in (("long", long), ("short", short))}
    threads["long"].start()
    try:
        assert stepped.wait(timeout=60)
        (first,) = events[:-1]  # the long prompt's first chunk: it still prefills
        assert first[:2] == ("long", 0) and first[2] < len(long)
        threads["short"].start()
        while scheduler.waiting < 1:
            time.sleep(0.005)
    finally:
        resume.set()
    for thread in threads.values():
        thread.join()

    steps = [i for i, event in enumerate(events) if event[0] == "step"]
    second = events[steps[0] + 1 : steps[1]]
    assert ("short", 0, len(short)) in second  # its whole prefill, at the very next step
    prefilled = [e for e in events if e[0] != "step" and e[1] < len(long if e[0] == "long" else short)]
    last_long = max(i for i, e in enumerate(events) if e in prefilled and e[0] == "long")
    first_decode = min(i for i, e in enumerate(events) if e[0] == "short" and e[1] >= len(short))
    assert first_decode < last_long  # it decodes while the long prompt still prefills
    # every step's prefill stays within the one budget
    for begin, end in zip([-1, *steps], steps, strict=False):
        assert sum(e[2] for e in events[begin + 1 : end] if e in prefilled) <= CHUNK
    assert outputs["long"] == run_hooked(serial, long, params, [])
    assert outputs["short"] == run_hooked(serial, short, params, [])


def test_plain_greedy_rows_share_one_argmax(serial, batched, monkeypatch):
    from millm_engine_transformers import batching

    calls = []  # the rows each sampler call got
    choose, choose_rows = batching.choose, batching.choose_rows

    def counted(logits, params, generator):
        calls.append(1)
        return choose(logits, params, generator)

    def counted_rows(logits, params, generators):
        calls.append(len(params))
        return choose_rows(logits, params, generators)

    monkeypatch.setattr(batching, "choose", counted)
    monkeypatch.setattr(batching, "choose_rows", counted_rows)
    ids = prompts(serial)[:5]
    greedy = SamplingParams(max_tokens=6, temperature=0, logprobs=2)
    want = [run(serial, p, greedy) for p in ids]
    jobs = [(p, greedy, None) for p in ids]
    got = concurrently(batched, jobs)
    assert calls == []  # no row chose on its own terms
    for alone, together in zip(want, got, strict=True):
        assert [int(t) for t in together] == [int(t) for t in alone]
        for a, b in zip(alone, together, strict=True):
            assert abs(a.logprob - b.logprob) <= 1e-4 and [t.token_id for t in a.top] == [t.token_id for t in b.top]
    # a row with a penalty (or bias, processors, a temperature) still chooses on its own terms
    penalised = SamplingParams(max_tokens=6, temperature=0, frequency_penalty=1.0)
    got = concurrently(batched, [(ids[0], penalised, None), (ids[1], greedy, None)])
    assert sum(calls) == len(got[0])
    assert got[0] == run(serial, ids[0], penalised)


def test_a_first_arrival_waits_up_to_the_gather_time_unless_the_room_fills(serial, tiny_model_dir):
    engine = load(tiny_model_dir, MILLM_BATCHING="continuous", MILLM_BATCH_MAX_ROWS="2", MILLM_BATCH_GATHER_MS="3000")
    try:
        ids = prompts(serial)
        params = SamplingParams(max_tokens=3, temperature=0)
        first_token: dict[int, float] = {}
        began = time.monotonic()

        def work(index):
            tokens = engine.generate(ids[index], params)
            next(tokens)
            first_token[index] = time.monotonic() - began
            tokens.close()

        # two arrivals 0.3 s apart fill the room: one prefill, at once on the second's arrival
        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        threads[0].start()
        time.sleep(0.3)
        threads[1].start()
        for thread in threads:
            thread.join()
        assert engine.batch.prefills == 1
        assert max(first_token.values()) < 2.5
        # one alone waits the gather time for company
        began = time.monotonic()
        work(2)
        assert first_token[2] >= 2.9
        assert engine.batch.prefills == 2
    finally:
        engine.close()


def test_without_a_gather_time_a_first_arrival_starts_at_once(serial, batched):
    ids = prompts(serial)
    params = SamplingParams(max_tokens=3, temperature=0)
    before = batched.batch.prefills
    first = threading.Thread(target=run, args=(batched, ids[1], params))
    first.start()
    time.sleep(0.3)
    run(batched, ids[2], params)
    first.join()
    assert batched.batch.prefills == before + 2


def test_sampled_rows_are_drawn_together_each_as_it_would_alone(serial, batched, monkeypatch):
    from millm_engine_transformers import batching

    widths = []
    choose_rows = batching.choose_rows

    def counted_rows(logits, params, generators):
        widths.append(len(params))
        return choose_rows(logits, params, generators)

    monkeypatch.setattr(batching, "choose_rows", counted_rows)
    ids = prompts(serial)
    seeded = [
        SamplingParams(max_tokens=10, temperature=0.9, top_p=0.95, seed=11),
        SamplingParams(max_tokens=10, temperature=1.3, seed=12, logprobs=2),
        SamplingParams(max_tokens=10, temperature=0.7, top_p=0.5, seed=13, presence_penalty=0.5),
        SamplingParams(max_tokens=10, temperature=1.0, top_p=0.8, seed=14, logit_bias={5: 3.0}),
        SamplingParams(max_tokens=10, temperature=0, frequency_penalty=0.4),  # greedy, not plain
    ]
    want = [run(serial, ids[i + 2], p) for i, p in enumerate(seeded)]
    got = concurrently(batched, [(ids[i + 2], p, None) for i, p in enumerate(seeded)])
    for alone, together in zip(want, got, strict=True):
        assert [int(t) for t in together] == [int(t) for t in alone]
        for a, b in zip(alone, together, strict=True):
            if hasattr(a, "logprob"):
                assert abs(a.logprob - b.logprob) <= 1e-4
    assert max(widths) > 1  # some steps drew several rows at once


def test_a_row_with_nothing_left_to_draw_fails_alone(serial, batched):
    ids = prompts(serial)
    params = SamplingParams(max_tokens=5, temperature=0.8, seed=3)

    def nothing(generated, logits):
        return torch.full_like(logits, float("-inf"))

    outcome: dict[str, object] = {}

    def hopeless():
        try:
            list(batched.generate(ids[4], params, logits_processors=[nothing]))
        except RuntimeError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=hopeless)
    thread.start()
    others = concurrently(batched, [(p, params, None) for p in ids[:3]])
    thread.join()
    assert "error" in outcome
    assert others == [run(serial, p, params) for p in ids[:3]]
