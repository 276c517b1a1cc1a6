"""While the batch generates, a storm of dropped streams is paced at intake, and costs the batch nothing lasting.

A real ``millm serve`` on the tiny model, continuous batching. One long generation runs;
two clients open streamed completions and drop each once its headers arrive, again and
again (the drop storm of issue 35 §2), and raw sockets send whole requests and close at
once. The intake gate (``millm_host/intake.py``) charges each dropped request the time it
held the server and keeps new requests waiting for that long times nine (``intake_charged``
and ``intake_paced`` in ``/api/health/inference``); the long generation finishes,
the queue empties, and the server answers at once afterwards. The throughput the steady
clients keep beside such a storm is measured by ``bench/drop_storm.py``.
"""

from __future__ import annotations

import threading

import httpx
import pytest

from millm_host.testing.helpers import sent_raw
from millm_host.testing.replicas import wait_until

DROPS_EACH = 15


@pytest.fixture(scope="module")
def server(server_factory, tiny_model_dir):
    return server_factory(tiny_model_dir, env={"MILLM_BATCHING": "continuous", "MILLM_INTAKE_SHARE": "0.1"})


def inference(server) -> dict:
    return httpx.get(f"{server.base_url}/api/health/inference", timeout=30).json()


def test_a_drop_storm_beside_a_running_generation_is_paced_and_leaves_nothing_behind(server):
    model = server.model_id
    before = inference(server)
    long_answer: list[httpx.Response] = []
    long_body = {"model": model, "prompt": "Once", "max_tokens": 400, "ignore_eos": True, "temperature": 0}

    def long_generation() -> None:
        long_answer.append(httpx.post(f"{server.base_url}/v1/completions", json=long_body, timeout=300))

    runner = threading.Thread(target=long_generation)
    runner.start()
    wait_until(lambda: inference(server)["running"] == 1, "the long generation to run", interval=0.01)
    drop_body = {"model": model, "prompt": "Tell me a story", "max_tokens": 200, "stream": True}
    statuses: list[int] = []

    def dropper() -> None:
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            for _ in range(DROPS_EACH):
                with http.stream("POST", "/v1/completions", json=drop_body) as response:
                    statuses.append(response.status_code)  # the headers are in: drop it

    droppers = [threading.Thread(target=dropper) for _ in range(2)]
    for thread in droppers:
        thread.start()
    sent_and_gone = [sent_raw(server.base_url, "/v1/completions", drop_body) for _ in range(10)]
    for sock in sent_and_gone:
        sock.close()
    for thread in droppers:
        thread.join()
    during = inference(server)
    runner.join()
    assert statuses == [200] * (2 * DROPS_EACH)
    assert long_answer[0].status_code == 200, long_answer[0].text
    assert long_answer[0].json()["usage"]["completion_tokens"] == 400
    assert during["intake_charged"] - before["intake_charged"] >= 2 * DROPS_EACH  # each drop was charged
    assert during["intake_paced"] > before["intake_paced"]  # and the requests after it waited
    # a dropped row leaves the batch at its next step, which may come just after its queue place is freed
    wait_until(
        lambda: (lambda now: now["admitted"] == now["waiting"] == now["running"] == 0)(inference(server)),
        "every dropped request to leave the queue and the batch",
        interval=0.01,
    )
    after = inference(server)
    assert after["waiting"] == 0 and after["running"] == 0
    answer = httpx.post(f"{server.base_url}/v1/completions", json={**long_body, "max_tokens": 4}, timeout=60)
    assert answer.status_code == 200, answer.text
    print(
        f"{2 * DROPS_EACH} streams dropped at their headers and 10 requests sent and dropped beside a "
        f"400-token generation: {after['intake_charged'] - before['intake_charged']} charged, "
        f"{after['intake_paced'] - before['intake_paced']} paced at intake, "
        f"{after['intake_left'] - before['intake_left']} left while waiting, "
        f"{after['batched'] - before['batched']} entered the batch"
    )
