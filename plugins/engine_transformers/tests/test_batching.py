"""Continuous batching (``MILLM_BATCHING=continuous``) on a tiny random Llama.

The engine half: a row computes in the batch what it computes alone (greedy tokens
equal, log-probabilities within 1e-4), whatever joins and leaves around it; a
seeded row draws the same; a closed stream leaves the batch; layer hooks (steering
writes, reads) work per row: a callback sees its own row, the steered residual equals
the serial one within 1e-5, and a hook that raises fails its own row only.
"""

from __future__ import annotations

import contextvars
import threading

import pytest

from millm_host.api import LayerHook, ModelDescriptor, SamplingParams, Setting, Settings
from millm_host.engine import GENERATION_CANCEL  # what the host sets around a request's generate

#: Prompt lengths from one token to past several prefill chunks.
WORDS = (0, 1, 3, 8, 20, 40, 2, 15, 60, 5, 33, 11)


def load(model_dir, *declared: Setting, **env):
    from millm_engine_transformers.engine import TransformersEngine

    descriptor = ModelDescriptor(id="tiny", path=str(model_dir), format="hf", engine="transformers")
    settings = Settings(environ=env)
    for setting in declared:
        settings.declare(setting)
    return TransformersEngine.load(descriptor, settings, lambda message: None)


@pytest.fixture(scope="module")
def batched(tiny_model_dir):
    # A small chunk: the longer prompts prefill over several steps while others decode.
    engine = load(tiny_model_dir, MILLM_BATCHING="continuous", MILLM_PREFILL_CHUNK="7", MILLM_BATCH_MAX_ROWS="6")
    yield engine
    engine.close()


def prompts(engine) -> list[list[int]]:
    return [engine.tokenize("word " * n + "end") for n in WORDS]


def run(engine, ids, params, stop_after=None) -> list:
    """Tokens until EOS or max_tokens, as the host reads them (closing the stream at the end)."""
    out = []
    tokens = engine.generate(ids, params)
    try:
        for token in tokens:
            out.append(token)
            if token in engine.info.eos_token_ids or len(out) >= (stop_after or params.max_tokens):
                break
    finally:
        tokens.close()
    return out


def concurrently(engine, jobs) -> list:
    """Each ``(ids, params, stop_after)`` on its own thread, started together; their outputs in order."""
    results: list = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def work(index, ids, params, stop_after):
        start.wait()
        results[index] = run(engine, ids, params, stop_after)

    threads = [threading.Thread(target=work, args=(i, *job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_continuous_is_the_default_and_serial_can_be_chosen(tiny_model_dir, serial):
    engine = load(tiny_model_dir)
    try:
        assert engine.concurrent_generation is True and engine.inference()["backend"] == "continuous"
    finally:
        engine.close()
    assert serial.concurrent_generation is False
    assert serial.inference()["backend"] == "serial"


def test_greedy_rows_equal_their_serial_outputs_token_for_token(serial, batched):
    params = SamplingParams(max_tokens=30, temperature=0, logprobs=2)
    ids = prompts(serial)
    want = [run(serial, p, params) for p in ids]
    # different max_tokens: rows leave at different steps while others still decode
    jobs = [(p, SamplingParams(max_tokens=8 + 2 * i, temperature=0, logprobs=2), None) for i, p in enumerate(ids)]
    got = concurrently(batched, jobs)
    steps_before = batched.inference()["steps"]
    assert steps_before > 0
    for alone, together in zip(want, got, strict=True):
        assert [int(t) for t in together] == [int(t) for t in alone[: len(together)]]
        for a, b in zip(alone, together, strict=False):
            assert abs(a.logprob - b.logprob) <= 1e-4
    # fewer steps than tokens: rows shared steps
    assert steps_before < sum(len(g) for g in got)


def test_requests_that_arrive_together_prefill_together_and_equal_their_serial_outputs(serial, batched):
    import time

    ids = prompts(serial)[:6]  # 1 to 60 words: much padding, and a prefill over many chunks
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=2)
    want = [run(serial, p, params) for p in ids]
    # Hold the model: the six queue up while the scheduler waits for its turn, then start as one prefill.
    before = batched.batch.prefills
    results: list = [None] * len(ids)

    def work(index):
        results[index] = run(batched, ids[index], params)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(ids))]
    with batched.batch.held():
        for thread in threads:
            thread.start()
        while batched.batch.waiting < len(ids):
            time.sleep(0.01)
    for thread in threads:
        thread.join()
    assert batched.batch.prefills == before + 1
    for alone, together in zip(want, results, strict=True):
        assert [int(t) for t in together] == [int(t) for t in alone]
        for a, b in zip(alone, together, strict=True):
            assert abs(a.logprob - b.logprob) <= 1e-4


def test_a_read_hook_sees_only_its_real_tokens_in_a_padded_prefill(serial, batched):
    import time

    import torch

    ids = prompts(serial)
    params = SamplingParams(max_tokens=3, temperature=0)
    short, long = ids[0], ids[8]  # the short one is all padding in the first chunks
    alone = Steer(5)
    run_hooked(serial, short, params, alone.hooks())
    steer = Steer(5)
    outputs: list = [None, None]

    def work(index, prompt, hooks):
        outputs[index] = run_hooked(batched, prompt, params, hooks)

    threads = [
        threading.Thread(target=work, args=(0, short, steer.hooks())),
        threading.Thread(target=work, args=(1, long, [])),
    ]
    with batched.batch.held():
        for thread in threads:
            thread.start()
        while batched.batch.waiting < 2:
            time.sleep(0.01)
    for thread in threads:
        thread.join()
    assert sorted(steer.rows) == sorted(alone.rows)  # its own positions, none of the padding
    assert torch.allclose(steer.residual(), alone.residual(), atol=1e-5, rtol=0)
    assert outputs[1] == run_hooked(serial, long, params, [])


def test_a_seeded_row_draws_the_same_whatever_shares_its_batch(serial, batched):
    ids = prompts(serial)
    seeded = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=1234, frequency_penalty=0.3)
    alone = run(serial, ids[3], seeded)
    others = [(p, SamplingParams(max_tokens=12, temperature=1.0), None) for p in ids[:5]]
    together = concurrently(batched, [(ids[3], seeded, None), *others])[0]
    assert together == alone


def test_a_closed_stream_leaves_the_batch(serial, batched):
    ids = prompts(serial)
    params = SamplingParams(max_tokens=40, temperature=0)
    # two stop reading after 3 tokens (a disconnect, a stop string): the others finish unchanged
    want = [run(serial, p, params) for p in ids[:4]]
    got = concurrently(batched, [(p, params, 3 if i % 2 else None) for i, p in enumerate(ids[:4])])
    for i, (alone, together) in enumerate(zip(want, got, strict=True)):
        assert together == (alone[:3] if i % 2 else alone)
    report = batched.inference()
    assert report["running"] == 0 and report["waiting"] == 0


def test_a_cancelled_request_leaves_the_batch_at_the_next_step_waiting_or_decoding(tiny_model_dir, serial):
    """A cancelled request (``generation_cancel``, set by the host when its client leaves) leaves without
    its consumer reading another token: one waiting for a full batch is never prefilled, and a decoding
    one ends its stream at the next step. The rows that stay finish unchanged."""
    engine = load(tiny_model_dir, MILLM_BATCHING="continuous", MILLM_BATCH_MAX_ROWS="1")
    try:
        ids = prompts(serial)
        long = SamplingParams(
            max_tokens=400, temperature=0, logit_bias={eos: -100.0 for eos in serial.info.eos_token_ids}
        )
        want = run(serial, ids[0], long)
        running_cancel, waiting_cancel = threading.Event(), threading.Event()

        def submitted(prompt, cancel):
            return contextvars.copy_context().run(
                lambda: (GENERATION_CANCEL.set(cancel), engine.generate(prompt, long))[1]
            )

        running = submitted(ids[0], running_cancel)
        first = next(running)  # it decodes; the batch (one row) is full
        waiting = submitted(ids[1], waiting_cancel)
        ended: list = []
        reader = threading.Thread(target=lambda: ended.extend(waiting))  # blocked until it joins, or leaves
        reader.start()
        waiting_cancel.set()
        reader.join(30)
        assert not reader.is_alive() and ended == []  # it left without a token: never prefilled
        assert engine.inference()["waiting"] == 0 and engine.batch.prefills == 1
        assert [first, *(next(running) for _ in range(9))] == want[:10]
        running_cancel.set()  # no more reading: its stream ends at the next step
        rest = list(running)
        assert len(rest) <= 1 and engine.inference()["running"] == 0
    finally:
        engine.close()


def test_a_logits_processor_is_applied_to_its_row_only(serial, batched):
    ids = prompts(serial)
    banned = run(serial, ids[2], SamplingParams(max_tokens=1, temperature=0))[0]

    def ban(generated, logits):
        logits = logits.clone()
        logits[banned] = float("-inf")
        return logits

    results: dict[str, list[int]] = {}

    def constrained():
        tokens = batched.generate(ids[2], SamplingParams(max_tokens=4, temperature=0), logits_processors=[ban])
        results["constrained"] = list(tokens)  # a batched row ends by itself at max_tokens

    thread = threading.Thread(target=constrained)
    thread.start()
    results["free"] = run(batched, ids[2], SamplingParams(max_tokens=4, temperature=0))
    thread.join()
    assert banned not in results["constrained"]
    assert results["free"][0] == banned


class Steer:
    """A steering write at layer 0 and a read of the residual it leads to (layer 1's input), by position."""

    def __init__(self, seed: int | None):
        import torch

        self.delta = None
        if seed is not None:
            generator = torch.Generator().manual_seed(seed)
            self.delta = torch.randn(64, generator=generator) * 2.0
        self.rows: dict[int, object] = {}
        self.shapes: set[tuple[int, ...]] = set()

    def hooks(self) -> list[LayerHook]:
        hooks = [LayerHook(1, "resid_pre", self.read, order=0)]
        if self.delta is not None:
            hooks.append(LayerHook(0, "resid_post", lambda hidden, start: hidden + self.delta, order=100))
        return hooks

    def read(self, hidden, start):
        self.shapes.add(tuple(hidden.shape[:1]))
        for offset, row in enumerate(hidden[0]):
            self.rows[start + offset] = row.clone()

    def residual(self):
        import torch

        return torch.stack([self.rows[p] for p in sorted(self.rows)])


def test_steered_and_read_rows_share_the_batch_and_match_their_serial_runs(serial, batched):
    import torch

    ids = prompts(serial)
    params = SamplingParams(max_tokens=12, temperature=0)
    # rows 0 and 2 steered, each with its own vector; every row reads; row 3 has no hooks at all
    seeds = [1, None, 2, None]
    alone = []
    for index, seed in enumerate(seeds):
        steer = Steer(seed)
        tokens = run_hooked(serial, ids[index + 3], params, steer.hooks() if index != 3 else [])
        alone.append((tokens, steer))
    before = batched.inference()
    steers = [Steer(seed) for seed in seeds]
    results: list = [None] * 4
    barrier = threading.Barrier(4)

    def work(index):
        barrier.wait()
        hooks = steers[index].hooks() if index != 3 else []
        results[index] = run_hooked(batched, ids[index + 3], params, hooks)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index in range(4):
        want_tokens, want_steer = alone[index]
        assert results[index] == want_tokens
        if index != 3:
            got = steers[index].residual()
            want = want_steer.residual()
            assert got.shape == want.shape
            assert torch.allclose(got, want, atol=1e-5, rtol=0)
            assert steers[index].shapes == {(1,)}  # a callback sees its own row only
    # steering changed the answers it should have
    assert alone[0][0] != run_hooked(serial, ids[3], params, [])
    after = batched.inference()
    assert after["batched"] == before["batched"] + 4
    assert after["serial_reasons"] == before["serial_reasons"]


def run_hooked(engine, ids, params, hooks) -> list[int]:
    tokens = engine.generate(ids, params, hooks=hooks)
    out = []
    try:
        for token in tokens:
            out.append(int(token))
            if token in engine.info.eos_token_ids or len(out) >= params.max_tokens:
                break
    finally:
        tokens.close()
    return out


def test_a_hook_that_raises_fails_its_own_row_only(serial, batched):
    ids = prompts(serial)
    params = SamplingParams(max_tokens=10, temperature=0)
    calls = []

    def broken(hidden, start):
        calls.append(start)
        if len(calls) > 2:  # after the prefill: while decoding beside the others
            raise RuntimeError("a broken hook")

    outcome: dict[str, object] = {}

    def hooked():
        try:
            run_hooked(batched, ids[5], params, [LayerHook(0, "resid_post", broken)])
        except RuntimeError as exc:
            outcome["error"] = str(exc)

    thread = threading.Thread(target=hooked)
    thread.start()
    plain = concurrently(batched, [(p, params, None) for p in ids[:3]])
    thread.join()
    assert outcome["error"] == "a broken hook"
    assert [[int(t) for t in got] for got in plain] == [run_hooked(serial, p, params, []) for p in ids[:3]]


def test_probe_force_serial_runs_probed_generations_alone(tiny_model_dir):
    # the probes plugin declares it (default true); the engine reads it when a probes hook comes
    force = Setting("PROBE_FORCE_SERIAL", bool, True, "")
    engine = load(tiny_model_dir, force, MILLM_BATCHING="continuous")
    try:
        ids = engine.tokenize("hello there")
        seen = []
        probe = LayerHook(0, "resid_post", lambda hidden, start: seen.append(hidden.shape[0]), owner="probes")
        run_hooked(engine, ids, SamplingParams(max_tokens=3, temperature=0), [probe])
        report = engine.inference()
        assert report["serial_reasons"] == {"probe_force_serial": 1} and report["batched"] == 0
    finally:
        engine.close()


def test_an_unknown_backend_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="MILLM_BATCHING"):
        load(tiny_model_dir, MILLM_BATCHING="paged")


def test_a_row_cancelled_mid_prefill_is_cut_out_and_its_neighbour_computes_as_alone(serial, batched, monkeypatch):
    """Two long prompts prefill together over many chunks; one's request is cancelled halfway. It leaves
    at the next step (its tokens and cache cut out of the prefill), and the other's answer is its serial one."""
    from millm_engine_transformers.batching import Prefill

    cut: list[tuple[int, int]] = []  # (columns prefilled, rows that left) at each cut
    original = Prefill.cut_left

    def spy(group):
        done, leaving = group.done, original(group)
        if leaving:
            cut.append((done, len(leaving)))
        return leaving

    monkeypatch.setattr(Prefill, "cut_left", spy)
    # Prompts no earlier test sent: a prompt the prefix cache held would prefill on its own.
    kept_ids, dropped_ids = serial.tokenize("halfway " * 60 + "end"), serial.tokenize("other " * 50 + "end")
    params = SamplingParams(max_tokens=6, temperature=0)
    want = run(serial, kept_ids, params)
    cancels = [threading.Event(), threading.Event()]
    results: list = [None, None]

    def work(index, ids):
        def submit():
            GENERATION_CANCEL.set(cancels[index])
            return run(batched, ids, params)

        results[index] = contextvars.copy_context().run(submit)

    prefills = batched.batch.prefills
    with batched.batch.held():  # both arrive before the next step: one prefill for the two
        threads = [threading.Thread(target=work, args=(i, ids)) for i, ids in enumerate((kept_ids, dropped_ids))]
        for thread in threads:
            thread.start()
        while batched.batch.waiting < 2:
            threading.Event().wait(0.001)
    while not (batched.batch._prefilling and batched.batch._prefilling[0].done):
        threading.Event().wait(0.0005)
    with batched.batch.held():
        group = batched.batch._prefilling[0]
        assert len(group.rows) == 2 and 0 < group.done < group.ids.shape[1]  # halfway through
        cancels[1].set()
    for thread in threads:
        thread.join(60)
    assert batched.batch.prefills == prefills + 1
    assert results == [want, []]
    assert cut and cut[0][0] > 0 and cut[0][1] == 1  # cut out with its cache, before the prefill ended
