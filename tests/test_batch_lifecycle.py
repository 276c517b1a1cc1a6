"""A batch cancelled mid-line, and a batch resumed by a new server on the same data directory."""

from __future__ import annotations

import json
import time

import pytest
import sqlalchemy as sa

from millm_host.testing import AppServer, databases

from .test_batch_api import CHAT, chat_line, jsonl, read_jsonl, wait_for

pytestmark = pytest.mark.storage


def test_a_cancelled_batch_stops_its_running_line_and_files_every_unrun_one(app_factory):
    app = app_factory(
        plugins=["fault_injection"], env={"FAULT_INJECTION": "slow:1:120", "MILLM_BATCH_CONCURRENCY": "1"}
    )
    client = app.openai()
    records = [chat_line("first"), chat_line("stuck", "FAULT"), chat_line("never-1"), chat_line("never-2")]
    source = client.files.create(file=("in.jsonl", jsonl(records)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h")
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).request_counts.completed < 1:  # "first" done, "stuck" running
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    done = wait_for(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 1, 3)
    assert [o["custom_id"] for o in read_jsonl(client, done.output_file_id)] == ["first"]
    errors = read_jsonl(client, done.error_file_id)
    assert [e["custom_id"] for e in errors] == ["stuck", "never-1", "never-2"]
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    # the cancelled line let the engine go: a live request is answered
    with app.http() as http:
        assert http.post(CHAT, json=chat_line("x")["body"]).status_code == 200


def test_a_restarted_server_resumes_a_batch_without_running_a_finished_line_again(tmp_path):
    records = [chat_line(f"line-{i}", f"text {i}") for i in range(6)]
    with AppServer(tmp_path) as app:
        client = app.openai()
        source = client.files.create(file=("in.jsonl", jsonl(records)), purpose="batch")
        batch = wait_for(
            client, client.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h").id
        )
        assert batch.status == "completed"
        first_ids = {o["custom_id"]: o["id"] for o in read_jsonl(client, batch.output_file_id)}
    # What a crash after three lines leaves: three lines done, three pending, the batch in progress.
    engine = sa.create_engine(databases.database_url(tmp_path))
    with engine.begin() as db:
        for number in (4, 5, 6):
            body = json.dumps(records[number - 1]["body"])
            db.execute(
                sa.text(
                    "UPDATE batch_lines SET state='pending', result=NULL, request=:b WHERE batch_id=:id AND line=:n"
                ),
                {"b": body, "id": batch.id, "n": number},
            )
        db.execute(
            sa.text(
                "UPDATE batches SET status='in_progress', completed=3, output_file_id=NULL, completed_at=NULL, "
                "finalizing_at=NULL WHERE id=:id"
            ),
            {"id": batch.id},
        )
    engine.dispose()
    with AppServer(tmp_path) as app:
        client = app.openai()
        resumed = wait_for(client, batch.id)
        assert resumed.status == "completed" and resumed.request_counts.completed == 6
        outputs = read_jsonl(client, resumed.output_file_id)
    assert [o["custom_id"] for o in outputs] == [f"line-{i}" for i in range(6)]  # each once, in input order
    kept = {o["custom_id"]: o["id"] for o in outputs[:3]}
    assert kept == {k: first_ids[k] for k in kept}  # the finished lines were not run again
    assert all(o["id"] != first_ids[o["custom_id"]] for o in outputs[3:])  # the pending ones ran
