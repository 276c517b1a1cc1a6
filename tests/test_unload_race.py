"""An unload while generations and a Batch API batch run (issue 35): bounded, and the batch keeps its place.

On the echo engine with the fault-injection plugin: a FAULT request is held at its first
token for ``HOLD_S`` (it returns early once cancelled), longer than the unload's
``GRACEFUL_UNLOAD_TIMEOUT``. The unload waits out the grace, then ends what still runs
(``503 model_unloaded``) and returns: before, it waited for the held line to end (the
issue's measure took 9.5 minutes the same way). The batch's cut-off line stays pending;
the batch neither reloads the model an operator unloaded nor fails: it waits,
``in_progress`` with the reason in its ``errors``, and once the model is loaded again it
finishes, every line run once.
"""

from __future__ import annotations

import time

import httpx
import pytest

from millm_host.batch_api import runner
from millm_host.testing import chat_body
from millm_host.testing.replicas import wait_until

from .test_batch_api import CHAT, chat_line, jsonl, read_jsonl, wait_for

pytestmark = pytest.mark.storage

GRACE_S = 0.5
HOLD_S = 1.5
RETRY_S = 0.2  # how often the batch runner looks again (1 s as served)


@pytest.fixture(scope="module")
def app(app_factory):
    env = {
        "FAULT_INJECTION": f"slow:1:{HOLD_S}",
        "MILLM_BATCH_CONCURRENCY": "1",
        "GRACEFUL_UNLOAD_TIMEOUT": str(GRACE_S),
    }
    return app_factory(plugins=["fault_injection"], env=env)


def unload_within_the_grace(http: httpx.Client) -> None:
    began = time.monotonic()
    unload = http.post("/api/models/echo/unload")
    took = time.monotonic() - began
    assert unload.status_code == 200, unload.text
    assert GRACE_S <= took < GRACE_S + 1.0, f"the unload took {took:.1f} s"
    health = http.get("/api/health").json()
    assert (health["status"], health["model"]) == ("no_model", None), health


def test_an_unload_ends_a_generation_still_running_after_the_grace(app):
    with httpx.Client(base_url=app.base_url, timeout=30) as http:
        held = httpx.Client(base_url=app.base_url, timeout=30)
        with held.stream("POST", CHAT, json=chat_body("echo", content="FAULT", max_tokens=5, stream=True)) as stream:
            assert stream.status_code == 200
            wait_until(lambda: http.get("/api/health").json()["queue"]["generating"], "the held generation")
            unload_within_the_grace(http)
            events = [line for line in stream.iter_lines() if line.startswith("data: {")]
        held.close()
        assert '"model_unloaded"' in events[-1] and "GRACEFUL_UNLOAD_TIMEOUT" in events[-1], events
        assert "generations ended (503 model_unloaded)" in app.log()
        assert http.post("/api/models/echo/load").status_code == 200
        assert http.post(CHAT, json=chat_body("echo", max_tokens=3)).status_code == 200


def test_a_batch_waits_for_the_model_an_operator_unloaded(app, monkeypatch):
    monkeypatch.setattr(runner, "RETRY_S", RETRY_S)
    client = app.openai()
    records = [chat_line("first"), chat_line("held", "FAULT"), chat_line("after-1"), chat_line("after-2")]
    source = client.files.create(file=("in.jsonl", jsonl(records)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h")
    with httpx.Client(base_url=app.base_url, timeout=30) as http:
        wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed == 1, "the first line")
        wait_until(lambda: http.get("/api/health").json()["queue"]["generating"], "the held line", interval=0.01)
        unload_within_the_grace(http)
        time.sleep(2.5 * RETRY_S)  # longer than the runner's retry: it must not load the model again
        assert http.get("/api/health").json()["status"] == "no_model"
        waiting = client.batches.retrieve(batch.id)
        assert waiting.status == "in_progress", waiting
        assert (waiting.request_counts.completed, waiting.request_counts.failed) == (1, 0)
        [why] = waiting.errors.data
        assert why.code == "model_unloaded" and "/api/models/echo/unload" in why.message, why

        assert http.post("/api/models/echo/load").status_code == 200
        done = wait_for(client, batch.id, timeout=30)
    assert done.status == "completed" and done.errors is None, done
    assert (done.request_counts.completed, done.request_counts.failed) == (4, 0)
    assert [o["custom_id"] for o in read_jsonl(client, done.output_file_id)] == ["first", "held", "after-1", "after-2"]
