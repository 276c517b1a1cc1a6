"""The Batch API in-process (echo engine): /v1/files and /v1/batches through the openai SDK and httpx."""

from __future__ import annotations

import json
import time

import pytest

from millm_host.testing import assert_error

pytestmark = pytest.mark.storage

CHAT = "/v1/chat/completions"


def line(custom_id: str, body: dict, url: str = CHAT) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(records: list) -> bytes:
    return b"".join((r if isinstance(r, str) else json.dumps(r)).encode() + b"\n" for r in records)


def chat_line(custom_id: str, text: str = "hello", model: str = "echo") -> dict:
    return line(custom_id, {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8})


def wait_for(client, batch_id: str, statuses=("completed", "failed", "cancelled", "expired"), timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.05)


def read_jsonl(client, file_id: str) -> list[dict]:
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


@pytest.fixture(scope="module")
def app(app_factory):
    return app_factory(env={"MILLM_FILES_MAX_BYTES": "4096"})


# --- /v1/files --------------------------------------------------------------------------------
def test_a_file_is_uploaded_listed_read_and_deleted(app):
    client = app.openai()
    data = jsonl([chat_line("a")])
    uploaded = client.files.create(file=("../../etc/in put.jsonl", data), purpose="batch")
    assert uploaded.object == "file" and uploaded.purpose == "batch" and uploaded.bytes == len(data)
    assert uploaded.filename == "in put.jsonl"  # a name, never a path
    assert (app.data_dir / "files" / uploaded.id).read_bytes() == data  # stored under its id
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    assert uploaded.id in [f.id for f in client.files.list(purpose="batch")]
    assert client.files.content(uploaded.id).content == data
    deleted = client.files.delete(uploaded.id)
    assert deleted.deleted and deleted.id == uploaded.id
    assert not (app.data_dir / "files" / uploaded.id).exists()
    with app.http() as http:
        assert_error(http.get(f"/v1/files/{uploaded.id}"), 404, "file_not_found", "file_id")


def test_files_are_listed_in_pages(app):
    client = app.openai()
    ids = [client.files.create(file=(f"{i}.jsonl", b"{}\n"), purpose="batch").id for i in range(3)]
    with app.http() as http:
        first = http.get("/v1/files", params={"limit": 2, "order": "asc"}).json()
        assert len(first["data"]) == 2 and first["has_more"] is True
        rest = http.get("/v1/files", params={"limit": 100, "order": "asc", "after": first["last_id"]}).json()
    listed = [f["id"] for f in first["data"] + rest["data"]]
    assert listed == sorted(set(listed), key=listed.index) and set(ids) <= set(listed)


def test_uploads_are_refused_in_openais_error_shape(app):
    with app.http() as http:
        wrong_purpose = http.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "fine-tune"})
        assert_error(wrong_purpose, 400, "invalid_parameter", "purpose")
        no_file = http.post("/v1/files", files={"other": ("a.jsonl", b"{}\n")}, data={"purpose": "batch"})
        assert_error(no_file, 400, "invalid_parameter", "file")
        too_large = http.post("/v1/files", files={"file": ("a.jsonl", b"x" * 5000)}, data={"purpose": "batch"})
        assert_error(too_large, 413, "file_too_large")
        as_json = http.post("/v1/files", json={"file": "x", "purpose": "batch"})
        assert_error(as_json, 415, "unsupported_media_type")
        assert_error(http.get("/v1/files/file-nope/content"), 404, "file_not_found")
    # nothing refused was kept
    assert not [p for p in (app.data_dir / "files").iterdir() if p.name.startswith(".upload")]


@pytest.mark.parametrize("after", [False, True], ids=["file-first", "purpose-first"])
def test_a_part_header_that_is_not_utf8_is_a_400_and_keeps_nothing(app, after):
    """A multipart file name in raw bytes that are not UTF-8 (``\\xff\\xfe.jsonl``) was a 500 from falcon's
    header decoding; now a 400 in OpenAI's shape, nothing stored, and the next upload works."""
    purpose = b'--XyZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
    upload = b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="\xff\xfe.jsonl"\r\n\r\n{}\n\r\n'
    body = (purpose + upload if after else upload + purpose) + b"--XyZ--\r\n"
    with app.http() as http:
        before = http.get("/v1/files").json()["data"]
        refused = http.post("/v1/files", content=body, headers={"Content-Type": "multipart/form-data; boundary=XyZ"})
        assert_error(refused, 400, "invalid_parameter", "file")
        assert "not UTF-8" in refused.json()["error"]["message"]
        assert http.get("/v1/files").json()["data"] == before
        fine = http.post("/v1/files", files={"file": ("\u00e9t\u00e9.jsonl", b"{}\n")}, data={"purpose": "batch"})
        assert fine.status_code == 200 and fine.json()["filename"] == "\u00e9t\u00e9.jsonl"
        http.delete(f"/v1/files/{fine.json()['id']}")
    assert not [p for p in (app.data_dir / "files").iterdir() if p.name.startswith(".upload")]


# --- /v1/batches ------------------------------------------------------------------------------
def test_a_batch_runs_every_valid_line_and_files_the_refused_ones(app):
    client = app.openai()
    records = [
        chat_line("ok-1", "first"),
        chat_line("bad-messages") | {"body": {"model": "echo"}},
        chat_line("ok-2", "second"),
        chat_line("wrong-url") | {"url": "/v1/embeddings"},
        chat_line("no-model", model="nonexistent"),
        "this is not json",
    ]
    source = client.files.create(file=("in.jsonl", jsonl(records)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h")
    assert batch.status in ("validating", "in_progress", "finalizing", "completed")
    done = wait_for(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (6, 2, 4)
    assert done.completed_at and done.in_progress_at and done.finalizing_at and done.model == "echo"

    outputs = {o["custom_id"]: o for o in read_jsonl(client, done.output_file_id)}
    assert set(outputs) == {"ok-1", "ok-2"}
    response = outputs["ok-1"]["response"]
    assert response["status_code"] == 200 and response["request_id"]
    assert response["body"]["object"] == "chat.completion"
    # the id the line was served (and logged, and traced) under, as the completion's own id says
    assert response["body"]["id"] == f"chatcmpl-{response['request_id']}"
    assert response["body"]["choices"][0]["message"]["content"].startswith("first")
    assert isinstance(response["millm"]["headers"], dict)
    assert all(name.lower().startswith("x-millm-") for name in response["millm"]["headers"])

    errors = {e["custom_id"]: e for e in read_jsonl(client, done.error_file_id)}
    assert set(errors) == {"bad-messages", "wrong-url", "no-model", None}
    refused = errors["bad-messages"]["response"]
    assert refused["status_code"] == 400 and refused["body"]["error"]["param"] == "messages"
    assert errors["wrong-url"]["response"]["body"]["error"]["param"] == "url"
    assert errors["no-model"]["response"]["status_code"] == 404
    assert errors["no-model"]["response"]["body"]["error"]["code"] == "model_not_found"
    assert set(errors[None]["response"]["body"]["error"]) >= {"message", "type", "param", "code"}

    assert batch.id in [b.id for b in client.batches.list()]


def test_long_custom_ids_are_stored_on_every_database(app):
    """No length is promised: PostgreSQL, which enforces VARCHAR lengths, stores them too (a 500 before)."""
    client = app.openai()
    long_id = "c" * 600
    records = [chat_line("unknown-model", model="m" * 300), chat_line(long_id, "long")]
    source = client.files.create(file=("in.jsonl", jsonl(records)), purpose="batch")
    done = wait_for(client, client.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h").id)
    assert done.status == "completed" and done.model == "echo", done
    assert [o["custom_id"] for o in read_jsonl(client, done.output_file_id)] == [long_id]
    assert [e["custom_id"] for e in read_jsonl(client, done.error_file_id)] == ["unknown-model"]


def test_a_line_carries_the_headers_its_live_request_would_have(app):
    client = app.openai()
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "unknown_field": 1}
    with app.http() as http:
        live = http.post(CHAT, json=body)
    expected = {k.lower(): v for k, v in live.headers.items() if k.lower().startswith("x-millm-")}
    assert expected, "the live request should carry an X-miLLM header (ignored fields)"
    source = client.files.create(file=("in.jsonl", jsonl([line("x", body)])), purpose="batch")
    done = wait_for(client, client.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h").id)
    headers = read_jsonl(client, done.output_file_id)[0]["response"]["millm"]["headers"]
    assert {k.lower(): v for k, v in headers.items()} == expected


def test_embeddings_and_completions_batches(app):
    client = app.openai()
    for url, body, kind in (
        ("/v1/embeddings", {"model": "echo", "input": "hello"}, "list"),
        ("/v1/completions", {"model": "echo", "prompt": "hello", "max_tokens": 3}, "text_completion"),
    ):
        source = client.files.create(file=("in.jsonl", jsonl([line("only", body, url)])), purpose="batch")
        done = wait_for(
            client, client.batches.create(input_file_id=source.id, endpoint=url, completion_window="24h").id
        )
        assert done.status == "completed" and done.request_counts.completed == 1, done
        assert read_jsonl(client, done.output_file_id)[0]["response"]["body"]["object"] == kind


def test_an_unusable_input_file_fails_the_batch(app):
    client = app.openai()
    source = client.files.create(file=("dup.jsonl", jsonl([chat_line("same"), chat_line("same")])), purpose="batch")
    done = wait_for(client, client.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h").id)
    assert done.status == "failed" and done.failed_at
    assert done.errors.data[0].code == "duplicate_custom_id" and done.errors.data[0].line == 2


def test_batch_creation_is_refused_in_openais_error_shape(app):
    with app.http() as http:
        missing = http.post(
            "/v1/batches", json={"input_file_id": "file-x", "endpoint": CHAT, "completion_window": "24h"}
        )
        assert_error(missing, 404, "file_not_found", "input_file_id")
        bad_endpoint = http.post(
            "/v1/batches", json={"input_file_id": "file-x", "endpoint": "/v1/images", "completion_window": "24h"}
        )
        assert_error(bad_endpoint, 400, "invalid_parameter", "endpoint")
        assert_error(http.get("/v1/batches/batch_nope"), 404, "batch_not_found", "batch_id")
        assert_error(http.post("/v1/batches/batch_nope/cancel"), 404, "batch_not_found", "batch_id")


def test_a_finished_batch_cannot_be_cancelled(app):
    client = app.openai()
    source = client.files.create(file=("in.jsonl", jsonl([chat_line("a")])), purpose="batch")
    done = wait_for(client, client.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h").id)
    with app.http() as http:
        assert_error(http.post(f"/v1/batches/{done.id}/cancel"), 409, "batch_not_cancellable")


def test_each_line_is_parsed_within_the_container_limit(app_factory):
    """A line is parsed as a live body is, within MILLM_MAX_JSON_CONTAINERS: one past it goes to the error
    file with its custom_id and the 400 a live request would get, and the others still run."""
    client = app_factory(env={"MILLM_MAX_JSON_CONTAINERS": "40"}).openai()
    over = chat_line("over") | {"body": {**chat_line("x")["body"], "x": [[]] * 40}}
    source = client.files.create(file=("in.jsonl", jsonl([chat_line("ok"), over])), purpose="batch")
    done = wait_for(client, client.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h").id)
    assert done.status == "completed", done
    assert [o["custom_id"] for o in read_jsonl(client, done.output_file_id)] == ["ok"]
    [error] = read_jsonl(client, done.error_file_id)
    assert error["custom_id"] == "over" and error["response"]["status_code"] == 400
    body = error["response"]["body"]["error"]
    assert body["code"] == "invalid_parameter" and "MILLM_MAX_JSON_CONTAINERS" in body["message"]
    assert set(body) >= {"message", "type", "param", "code"}


def test_a_refused_line_keeps_a_custom_id_that_follows_its_body(app_factory):
    """The parser stops at the refusal; the custom_id after the body is still found, and the error line has it."""
    client = app_factory(env={"MILLM_MAX_JSON_CONTAINERS": "40"}).openai()
    over = {"body": {**chat_line("x")["body"], "x": [[]] * 40}, "method": "POST", "url": CHAT, "custom_id": "late"}
    source = client.files.create(file=("in.jsonl", jsonl([chat_line("ok"), over])), purpose="batch")
    done = wait_for(client, client.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h").id)
    assert done.status == "completed", done
    [error] = read_jsonl(client, done.error_file_id)
    assert error["custom_id"] == "late" and error["response"]["status_code"] == 400


def test_file_content_is_served_as_documented(app):
    """/openapi.json says what GET /v1/files/{id}/content serves: the bytes, application/octet-stream."""
    client = app.openai()
    data = jsonl([chat_line("a"), chat_line("b")])
    uploaded = client.files.create(file=("two.jsonl", data), purpose="batch")
    with app.http() as http:
        documented = http.get("/openapi.json").json()["paths"]["/v1/files/{file_id}/content"]["get"]["responses"]
        served = http.get(f"/v1/files/{uploaded.id}/content")
    assert served.status_code == 200 and served.content == data
    assert list(documented["200"]["content"]) == [served.headers["content-type"]] == ["application/octet-stream"]
    assert documented["200"]["content"]["application/octet-stream"]["schema"] == {"type": "string", "format": "binary"}
    client.files.delete(uploaded.id)
