"""The Batch API on a real server: the openai SDK end to end, and ``kill -9`` in the middle of a batch."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import sqlalchemy as sa

from millm_host.testing import databases

from .test_batch_api import CHAT, jsonl, line

pytestmark = [pytest.mark.slow, pytest.mark.storage]

LINES = 40


def wait_until(predicate, timeout: float = 600):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return found


def done_lines(data_dir, batch_id: str) -> dict[str, str]:
    """custom_id → output line id of every line recorded as run, read straight from the database."""
    engine = sa.create_engine(databases.database_url(data_dir))
    try:
        with engine.connect() as db:
            rows = db.execute(
                sa.text("SELECT custom_id, result FROM batch_lines WHERE batch_id=:id AND state='done'"),
                {"id": batch_id},
            )
            # SQLite hands JSON back as text, PostgreSQL's driver as a decoded object
            return {
                custom_id: (json.loads(result) if isinstance(result, str) else result)["id"]
                for custom_id, result in rows
            }
    finally:
        engine.dispose()


def test_a_batch_survives_kill_9_without_losing_or_repeating_a_line(server_factory, tiny_model_dir, tmp_path):
    # The restarted server is a new replica (its name has the pid): it resumes the batch once the killed
    # one's lease expires, 2 s after the kill rather than the default 30.
    env = {"MILLM_BATCH_CONCURRENCY": "1", "MILLM_BATCH_LEASE_S": "2"}
    server = server_factory(tiny_model_dir, data_dir=tmp_path, env=env)
    client = server.openai()
    model = server.model_id
    records = [
        line(
            f"req-{i}",
            {
                "model": model,
                "messages": [{"role": "user", "content": f"count to {i}"}],
                "max_tokens": 48,
                "temperature": 0,
            },
        )
        for i in range(LINES)
    ]
    source = client.files.create(file=("in.jsonl", jsonl(records)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 3)
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    before = done_lines(tmp_path, batch.id)
    assert 3 <= len(before) < LINES, "the kill should land mid-batch"

    server.start()
    client = server.openai()
    finished = wait_until(
        lambda: (b := client.batches.retrieve(batch.id)).status in ("completed", "failed", "cancelled") and b
    )
    assert finished.status == "completed", finished
    assert finished.request_counts.total == finished.request_counts.completed == LINES
    assert finished.error_file_id is None
    outputs = [json.loads(x) for x in client.files.content(finished.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in outputs] == [f"req-{i}" for i in range(LINES)]  # none lost, none twice
    for output in outputs:
        response = output["response"]
        assert response["status_code"] == 200 and response["body"]["object"] == "chat.completion"
        assert "X-miLLM-Steering" in response["millm"]["headers"] or "x-millm-steering" in response["millm"]["headers"]
        if output["custom_id"] in before:  # recorded before the kill: never run again
            assert output["id"] == before[output["custom_id"]]
