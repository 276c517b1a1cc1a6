"""Continuous batching through the app's HTTP API, in-process (``MILLM_BATCHING=continuous``), with concurrent clients.

Answers equal the serial server's, streamed or not; a request that arrives while
others stream joins them; a client that leaves mid-stream leaves the batch and the
server goes on; ``/api/health/inference`` reports it all.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

PROMPTS = ["hi", "tell me a story about " * 3, "one two three four five six seven", "x " * 40, "ok", "why " * 9]


@pytest.fixture(scope="module")
def batching_server(tiny_app):
    return tiny_app(MILLM_BATCHING="continuous", MILLM_PREFILL_CHUNK="16")


@pytest.fixture(scope="module")
def serial_server(tiny_app):
    """What each batched answer is compared against."""
    return tiny_app(MILLM_BATCHING="serial")


def completion(server, prompt, max_tokens, stream=False) -> str:
    client = server.openai()
    body = {"model": server.model_id, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if not stream:
        return client.completions.create(**body).choices[0].text
    return "".join(chunk.choices[0].text for chunk in client.completions.create(**body, stream=True) if chunk.choices)


def together(calls) -> list:
    """Each call on its own thread, started together; their results in order."""
    results: list = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def work(index, call):
        barrier.wait()
        results[index] = call()

    threads = [threading.Thread(target=work, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def inference(server) -> dict:
    with server.http() as http:
        response = http.get("/api/health/inference")
    assert response.status_code == 200, response.text
    return response.json()


def test_the_default_server_batches_and_a_serial_one_says_so(tiny_server, serial_server):
    assert inference(tiny_server)["backend"] == "continuous"
    report = inference(serial_server)
    assert report["backend"] == "serial" and report["model"] == serial_server.model_id


def test_concurrent_clients_get_their_serial_answers(serial_server, batching_server):
    want = [completion(serial_server, p, 24) for p in PROMPTS]
    before = inference(batching_server)["batched"]
    got = together(
        [lambda p=p, i=i: completion(batching_server, p, 24, stream=bool(i % 2)) for i, p in enumerate(PROMPTS)]
    )
    assert got == want
    report = inference(batching_server)
    assert report["backend"] == "continuous"
    assert report["batched"] == before + len(PROMPTS)
    assert report["serial_reasons"] == {}


def test_a_request_joins_streams_already_running(serial_server, batching_server):
    long_want = completion(serial_server, PROMPTS[1], 200)
    short_want = completion(serial_server, PROMPTS[0], 10)
    client = batching_server.openai()
    body = {"model": batching_server.model_id, "max_tokens": 200, "temperature": 0, "stream": True}
    stream = client.completions.create(prompt=PROMPTS[1], **body)
    parts = [next(iter(stream)).choices[0].text]  # the long one is generating
    short = completion(batching_server, PROMPTS[0], 10)
    parts += [chunk.choices[0].text for chunk in stream if chunk.choices]
    assert short == short_want
    assert "".join(parts) == long_want


def test_a_client_that_leaves_mid_stream_leaves_the_batch(serial_server, batching_server):
    want = completion(serial_server, PROMPTS[2], 24)
    with batching_server.http() as http:
        body = {"model": batching_server.model_id, "prompt": PROMPTS[3], "max_tokens": 400, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as response:
            first = next(line for line in response.iter_lines() if line.startswith("data:"))
            assert "[DONE]" not in first  # generating; then the client goes away
    deadline = time.monotonic() + 60  # the server finds out at its next write
    while inference(batching_server)["running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert inference(batching_server)["running"] == 0
    assert completion(batching_server, PROMPTS[2], 24) == want  # and goes on serving


def test_n_choices_run_as_rows_and_draw_their_serial_seeds(serial_server, batching_server):
    def choices(server):
        body = {
            "model": server.model_id,
            "messages": [{"role": "user", "content": "Say something"}],
            "max_tokens": 12,
            "n": 3,
            "seed": 7,
            "temperature": 1.0,
        }
        return [c.message.content for c in server.openai().chat.completions.create(**body).choices]

    want = choices(serial_server)
    assert len(set(want)) > 1  # each choice its own seed
    before = inference(batching_server)["batched"]
    assert choices(batching_server) == want
    assert inference(batching_server)["batched"] == before + 3


def test_the_seed_header_says_a_batched_row_is_repeatable_for_its_batch_shape(serial_server, batching_server):
    """A seeded row in the continuous batch can round apart with the rows beside it, which the client does
    not choose: ``scope="batch-shape"``, streamed too (its header goes out before generation), and its
    ``system_fingerprint`` ends in ``+continuous``. Alone it is ``request`` and the plain fingerprint."""

    def served(server, stream: bool) -> tuple[str, set[str]]:
        body = {"model": server.model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        body.update(seed=11, temperature=0.9, stream=stream)
        with server.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
            text = response.read().decode()
            assert response.status_code == 200
            bodies = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
            return response.headers["x-millm-seed"], {b["system_fingerprint"] for b in bodies or [json.loads(text)]}

    plain = f"millm:{serial_server.model_id}@unrecorded:float32/F32:transformers"
    for stream in (False, True):
        assert served(batching_server, stream) == ('11;scope="batch-shape"', {plain + "+continuous"})
        assert served(serial_server, stream) == ('11;scope="request"', {plain})
