"""Probes inside a continuous batch (``MILLM_BATCHING=continuous``, ``PROBE_FORCE_SERIAL=false``).

Concurrent chats, each read by two armed probes at different layers while it
shares decode steps with the others (and its prompt is prefilled in chunks), score
what the independent reference computes for that chat alone (1e-4), and were
served in the batch, not on the serial fallback, and their results say so
(``execution_mode: continuous`` and the batch size).
"""

from __future__ import annotations

import threading

import pytest

from .test_correctness import TOLERANCE, WINDOWS, expected_spans

CHATS = [
    [{"role": "user", "content": "Where do foxes live?"}],
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three rivers of Europe, please."}],
    [{"role": "user", "content": "And what do they eat in winter, mostly?"}],
]
MAX_TOKENS = 6
PROBES = [("b-mean", 0, "resid_post", "mean", None, True), ("b-max", 2, "resid_pre", "max", None, False)]


@pytest.fixture(scope="module")
def batching_server(app_factory, probe_model_dir, sae_dir):
    return app_factory(
        plugins="all",
        models={},
        model=str(probe_model_dir),
        env={
            "PROBE_SAE_DIR": str(sae_dir),
            "MILLM_SAE_DIRS": str(sae_dir),
            "MILLM_BATCHING": "continuous",
            "PROBE_FORCE_SERIAL": "false",
            "MILLM_PREFILL_CHUNK": "5",
        },
    )


def test_probes_score_each_row_of_a_batch_as_alone(batching_server, lab, helpers):
    with batching_server.http() as http:
        model = http.get("/api/health").json()["model"]
        identity = http.get(f"/api/models/{model}").json()
        docs = {}
        for spec in PROBES:
            doc = lab.definition_of(identity, spec, windows=WINDOWS)
            skip = spec[-1]
            probe = helpers.import_probe(http, doc)
            helpers.arm(http, probe["id"])
            docs[probe["id"]] = (doc, skip)
    bodies: list = [None] * len(CHATS)
    barrier = threading.Barrier(len(CHATS))

    def work(index):
        with batching_server.http() as http:
            barrier.wait()
            response = http.post(
                "/v1/chat/completions",
                json={"model": model, "messages": CHATS[index], "max_tokens": MAX_TOKENS, "temperature": 0},
            )
        assert response.status_code == 200, response.text
        bodies[index] = response.json()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(CHATS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with batching_server.http() as http:
        report = http.get("/api/health/inference").json()
        for probe_id in docs:
            http.post(f"/api/probes/{probe_id}/disarm")
            http.delete(f"/api/probes/{probe_id}")
    assert report["backend"] == "continuous"
    assert report["serial_reasons"] == {} and report["batched"] >= len(CHATS)
    # Each result says it was served in the batch, and how many sequences its fullest pass held.
    sizes = [r["batch_size"] for body in bodies for r in body["millm_probe_verdicts"]]
    assert {r["execution_mode"] for body in bodies for r in body["millm_probe_verdicts"]} == {"continuous"}
    assert all(1 <= size <= len(CHATS) for size in sizes) and max(sizes) >= 2
    for chat, body in zip(CHATS, bodies, strict=True):
        prompt = lab.chat_ids(chat)
        generated = lab.greedy(prompt, MAX_TOKENS)
        assert body["usage"]["completion_tokens"] == len(generated)
        fed = prompt + (generated[:-1] if len(generated) == MAX_TOKENS else generated)
        results = body["millm_probe_verdicts"]
        assert len(results) == len(docs) * len(WINDOWS)
        for result in results:
            doc, skip = docs[result["probe_id"]]
            start, end = expected_spans(lab, prompt, fed, skip)[result["window"]]
            if end <= start:
                continue  # a window with nothing in it (a chat with no prefix to skip, ...)
            assert result["outcome"] == "completed", result
            assert result["n_scored_tokens"] == end - start, result
            assert abs(result["score"] - lab.score(doc, fed, start, end)) <= TOLERANCE, result


def test_one_batched_read_fills_each_requests_buffer_with_its_rows_only():
    """The row map, without a server: one ``capture_rows`` call for the batch, each Capture its own rows."""
    import torch

    from millm_host.api import HookRow
    from millm_probes.scoring.capture import Capture, capture_rows

    point = (1, "resid_post")
    first, second = Capture([point], 8), Capture([point], 8)
    (hook_a,), (hook_b,) = first.hooks(), second.hooks()
    assert hook_a.batched is hook_b.batched is capture_rows  # one function: one call serves both
    hidden = torch.arange(3 * 4 * 2, dtype=torch.float32).reshape(3, 4, 2)  # rows: a (1 pad), none, b
    capture_rows(hidden, [HookRow(0, 0, 1, hook_a, True), HookRow(2, 0, 0, hook_b, True)])
    capture_rows(hidden[:, -1:], [HookRow(0, 3, 0, hook_a, True), HookRow(2, 4, 0, hook_b, True)])  # a decode step
    assert torch.equal(first.rows()[point], torch.cat([hidden[0, 1:], hidden[0, -1:]]))
    assert torch.equal(second.rows()[point], torch.cat([hidden[2], hidden[2, -1:]]))
    assert (first.passes, second.passes, first.positions, second.positions) == (2, 2, 4, 5)
    assert first.batch_rows == second.batch_rows == 3  # the batch's sequences, the unmonitored one included


def test_parity_checks_each_vector_in_the_batch_shape_that_serves_it(batching_server, lab, helpers):
    """Parity feeds each vector through the serving batch beside a longer and a shorter row (its prompt
    prefilled left-padded, in chunks of 5 tokens here, its last tokens one decode step each) and gates on it."""
    with batching_server.http() as http:
        identity = http.get(f"/api/models/{http.get('/api/health').json()['model']}").json()
        for rule in ("mean", "max", "attention"):
            probe = helpers.import_probe(
                http, lab.definition(identity, name=f"batch-parity-{rule}", rule=rule, layer=2)
            )
            report = http.post(f"/api/probes/{probe['id']}/parity").json()
            http.delete(f"/api/probes/{probe['id']}")
            assert report["status"] == "passed", report
            assert report["shapes_checked"] == ["alone", "continuous_batch"]
            for vector in report["vectors"]:
                batched = vector["shapes"]["continuous_batch"]
                assert batched["passed"] and batched["difference"] <= 1e-4, batched
                assert batched["batch_rows"] == 3 and batched["beside"][0] == batched["prefilled"] + 7
                assert batched["passes"] > batched["decoded"] + 1  # the prompt took several prefill chunks
                assert abs(batched["score"] - vector["shapes"]["alone"]["score"]) <= 1e-4


def test_parity_fails_a_probe_that_reads_otherwise_in_the_batch(batching_server, lab, helpers, monkeypatch):
    """A batch that fed a vector's last tokens in another order (what a row-map bug would do) fails parity,
    though the vector scores right alone: the batch shape is checked, not assumed."""
    engine = batching_server.host.registry.engine
    real = engine.replay_in_batch

    def misordered(rows):
        (prompt, given, hooks), *others = rows
        real([(prompt, given[::-1], hooks), *others])

    monkeypatch.setattr(engine, "replay_in_batch", misordered)
    with batching_server.http() as http:
        identity = http.get(f"/api/models/{http.get('/api/health').json()['model']}").json()
        probe = helpers.import_probe(http, lab.definition(identity, name="batch-misread", rule="mean", layer=2))
        report = http.post(f"/api/probes/{probe['id']}/parity").json()
        http.delete(f"/api/probes/{probe['id']}")
    assert report["status"] == "failed", report
    for vector in report["vectors"]:
        assert vector["shapes"]["alone"]["passed"] and not vector["shapes"]["continuous_batch"]["passed"]
        assert vector["reason"].startswith("in the continuous batch: difference")
