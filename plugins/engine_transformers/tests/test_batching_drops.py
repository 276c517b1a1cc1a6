"""Requests whose clients leave while they wait for the batch never enter it (issue 35 §2).

The tiny model served in-process (``tiny_app``), continuous batching, with the fault-injection
plugin: a FAULT stream holds the batch thread at its 2nd token (one very long step).
Streams opened behind it, and non-streamed requests, wait for the batch; their clients
leave. They leave the queue at once, though the batch thread is still held, and when it
runs again none of them joins the batch: ``/api/health/inference`` counts them as
``left_waiting``, not ``batched``.
"""

from __future__ import annotations

import time

import httpx
import pytest

from millm_host.testing.helpers import sent_raw
from millm_host.testing.replicas import wait_until

BLOCK_S = 120  # the FAULT stream holds the batch thread this long unless cancelled
DROPS = 6


@pytest.fixture(scope="module")
def server(tiny_app):
    env = {"MILLM_BATCHING": "continuous", "FAULT_INJECTION": f"slow:2:{BLOCK_S}", "MILLM_QUEUE_MAX": "16"}
    return tiny_app(("fault_injection",), **env)


def inference(server) -> dict:
    return httpx.get(f"{server.base_url}/api/health/inference", timeout=30).json()


def test_requests_dropped_while_waiting_for_the_batch_never_enter_it(server):
    model = server.model_id
    before = inference(server)
    held = sent_raw(
        server.base_url, "/v1/completions", {"model": model, "prompt": "FAULT", "max_tokens": 50, "stream": True}
    )
    try:
        wait_until(
            lambda: inference(server)["batched"] == before["batched"] + 1,
            "the held stream to join the batch",
            interval=0.01,
        )
        time.sleep(0.2)  # its 2nd token: the batch thread is held
        streamed = {"model": model, "prompt": "a story", "max_tokens": 20, "stream": True}
        plain = {"model": model, "prompt": "a story", "max_tokens": 20}
        waiting = [sent_raw(server.base_url, "/v1/completions", streamed if i % 2 else plain) for i in range(DROPS)]
        wait_until(lambda: inference(server)["waiting"] == DROPS, "every request to wait for the batch", interval=0.01)
        for sock in waiting:
            sock.close()
        left = time.perf_counter()
        wait_until(
            lambda: inference(server)["waiting"] == 0, "the dropped requests to leave", timeout=10, interval=0.01
        )
        gone_after = time.perf_counter() - left
        report = inference(server)
        assert report["admitted"] == 1  # the held stream alone, still holding the batch thread
        assert report["left_waiting"] == before["left_waiting"] + DROPS
    finally:
        held.close()
    wait_until(lambda: inference(server)["admitted"] == 0, "the held stream to be cancelled", interval=0.01)
    with httpx.Client(base_url=server.base_url, timeout=60) as http:  # and the batch goes on
        answer = http.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 4})
    assert answer.status_code == 200, answer.text
    after = inference(server)
    assert after["batched"] == before["batched"] + 2  # the held stream and the last answer: no dropped one
    assert after["waiting"] == 0 and after["running"] == 0
    print(
        f"{DROPS} requests dropped while the batch thread was held: gone from the queue in {gone_after * 1000:.0f} ms"
    )
