"""Two replicas on one database and one batch: its lease lets one run it, the other resumes it after a crash.

Both replicas share the database (SQLite file, or PostgreSQL when
``MILLM_TEST_POSTGRES_URL`` is set) and the data directory (uploaded and output
files). Each replica's ``/metrics`` counts the lines it ran.
"""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from millm_host.testing.replicas import FAST_CONVERGE, shared_database_url, wait_until

from .test_batch_api import CHAT, jsonl, line

pytestmark = pytest.mark.slow

LINES = 16
#: Lines that never wait at the gate: the batch is under way once they are done.
OPEN = 2


def chat_lines_run(server) -> float:
    """Chat completions this replica served (a batch line is counted as a live request is)."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "millm_requests"
        for sample in family.samples
        if sample.name == "millm_requests_total" and sample.labels.get("endpoint") == "chat.completions"
    )


def done_lines(url: str, batch_id: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as db:
            return db.scalar(
                sa.text("SELECT count(*) FROM batch_lines WHERE batch_id=:id AND state='done'"), {"id": batch_id}
            )
    finally:
        engine.dispose()


def submit(server, name: str):
    """A batch whose first ``OPEN`` lines run straight through; the others wait at the gate while it is closed."""
    client = server.openai()
    model = server.model_id
    records = [
        line(
            f"{name}-{i}",
            {
                "model": model,
                "messages": [{"role": "user", "content": f"{'' if i < OPEN else 'FAULT '}count to {i}"}],
                "max_tokens": 8,
            },
        )
        for i in range(LINES)
    ]
    source = client.files.create(file=(f"{name}.jsonl", jsonl(records)), purpose="batch")
    return client.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h")


def finished(server, batch_id: str):
    client = server.openai()
    done = wait_until(
        lambda: (b := client.batches.retrieve(batch_id)).status in ("completed", "failed", "cancelled") and b,
        f"batch {batch_id} to finish",
        timeout=600,
    )
    assert done.status == "completed", done
    outputs = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    return [o["custom_id"] for o in outputs]


def test_one_replica_runs_a_batch_and_the_other_resumes_it_after_a_crash(server_factory, tiny_model_dir, tmp_path):
    url = shared_database_url(tmp_path)
    gate = tmp_path / "gate-open"  # while it is missing, a line past the first OPEN stops at its second token
    env = {
        "MILLM_DATABASE_URL": url,
        "MILLM_BATCH_CONCURRENCY": "1",
        "MILLM_BATCH_LEASE_S": "3",
        "FAULT_INJECTION": f"gate:2:{gate}",  # the batch outlasts B's start, however long that takes
        **FAST_CONVERGE,
    }
    data = tmp_path / "data"
    a = server_factory(tiny_model_dir, data_dir=data, env=env)
    first = submit(a, "first")
    wait_until(lambda: done_lines(url, first.id) >= OPEN, "the batch to be under way")
    b = server_factory(tiny_model_dir, data_dir=data, env=env)  # starts (and looks for batches to resume) mid-batch
    assert done_lines(url, first.id) < LINES, "B should start while A runs the batch"
    gate.touch()
    assert finished(b, first.id) == [f"first-{i}" for i in range(LINES)]
    assert chat_lines_run(a) + chat_lines_run(b) == LINES  # every line ran once, on one replica or the other

    gate.unlink()
    second = submit(a, "second")
    wait_until(lambda: done_lines(url, second.id) >= OPEN, "the second batch to be under way")
    ran_on_b = chat_lines_run(b)
    os.killpg(a.proc.pid, signal.SIGKILL)  # its lease stays until it expires; then B takes the batch over
    a.proc.wait(30)
    before = done_lines(url, second.id)
    assert before < LINES, "the kill should land mid-batch"
    gate.touch()
    assert finished(b, second.id) == [f"second-{i}" for i in range(LINES)]  # none lost, none twice
    assert chat_lines_run(b) - ran_on_b == LINES - before  # B ran exactly the lines A had not finished
