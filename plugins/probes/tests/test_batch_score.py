"""``/api/probes/score`` lines in the Batch API (hook ``register_batch_endpoints``), through the real server:
each output line's body is what the route answers, its results valid against ``mi.probe.result/v1``; a line
the route refuses becomes an error line with the route's status."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import pytest

from millm_host.testing import assert_error

SCHEMA_PATH = Path(__file__).resolve().parents[3] / "docs" / "schemas" / "probe-result-v1.json"
SCORE = "/api/probes/score"
#: What differs between two scorings of the same input: the ids each request is served under.
PER_REQUEST = {"result_id", "request_id", "trace_id", "span_id", "recorded_at"}


@pytest.fixture(scope="module")
def probe_id(probes_server, lab, identity, helpers):
    """One imported (never armed) probe reading the whole input and the last user turn."""
    doc = lab.definition(identity, name="batched-offline", rule="mean", windows=["all", "last_user"])
    with probes_server.http() as http:
        probe = helpers.import_probe(http, doc)
        yield probe["id"]
        http.delete(f"/api/probes/{probe['id']}")


def run_batch(http, records: list[dict], endpoint: str = SCORE) -> dict:
    data = b"".join(json.dumps(r).encode() + b"\n" for r in records)
    uploaded = http.post("/v1/files", files={"file": ("score.jsonl", data)}, data={"purpose": "batch"})
    assert uploaded.status_code == 200, uploaded.text
    created = http.post(
        "/v1/batches",
        json={"input_file_id": uploaded.json()["id"], "endpoint": endpoint, "completion_window": "24h"},
    )
    assert created.status_code == 200, created.text
    deadline = time.monotonic() + 120
    while (batch := http.get(f"/v1/batches/{created.json()['id']}").json())["status"] not in (
        "completed",
        "failed",
        "cancelled",
        "expired",
    ):
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
    return batch


def lines_of(http, file_id: str | None) -> dict[str, dict]:
    if file_id is None:
        return {}
    text = http.get(f"/v1/files/{file_id}/content").text
    return {line["custom_id"]: line for line in map(json.loads, text.splitlines())}


def same(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in PER_REQUEST}


def test_score_lines_answer_as_the_route_does(probes_server, probe_id):
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    bodies = {
        "text": {"probe_ids": [probe_id], "inputs": [{"text": "Is this safe?"}, {"text": "Name a colour."}]},
        "chat": {
            "probe_ids": [probe_id],
            "windows": ["all"],
            "inputs": [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}],
        },
    }
    records = [{"custom_id": cid, "method": "POST", "url": SCORE, "body": body} for cid, body in bodies.items()]
    records += [
        # refused as the route refuses it, before anything runs
        {"custom_id": "no-inputs", "method": "POST", "url": SCORE, "body": {"probe_ids": [probe_id], "inputs": []}},
        {"custom_id": "extra", "method": "POST", "url": SCORE, "body": {"inputs": [{"text": "x"}], "model": "m"}},
        # refused when it runs: no such probe
        {
            "custom_id": "unknown",
            "method": "POST",
            "url": SCORE,
            "body": {"probe_ids": ["prb_nope"], "inputs": [{"text": "x"}]},
        },
    ]
    with probes_server.http() as http:
        events = http.get("/api/probes/events", params={"limit": 1}).json()["data"]
        batch = run_batch(http, records)
        assert batch["status"] == "completed", batch
        assert batch["endpoint"] == SCORE and batch["request_counts"] == {"total": 5, "completed": 2, "failed": 3}
        done, failed = lines_of(http, batch["output_file_id"]), lines_of(http, batch["error_file_id"])
        assert set(done) == set(bodies) and set(failed) == {"no-inputs", "extra", "unknown"}
        for custom_id, body in bodies.items():
            direct = http.post(SCORE, json=body)
            assert direct.status_code == 200, direct.text
            response = done[custom_id]["response"]
            assert response["status_code"] == 200
            answer = response["body"]
            assert answer["object"] == "probe.score" and response["request_id"] == answer["request_id"]
            assert len(answer["results"]) == len(body["inputs"])
            for batched, live in zip(answer["results"], direct.json()["results"], strict=True):
                assert batched["n_tokens"] == live["n_tokens"] and batched["results"]
                for result in batched["results"]:
                    validator.validate(result)
                    assert result["persistence"] == "not_persisted" and result["outcome"] == "completed"
                assert [same(r) for r in batched["results"]] == [same(r) for r in live["results"]]
            assert answer["probes"] == direct.json()["probes"]
        for custom_id, status, code, param in [
            ("no-inputs", 400, "invalid_parameter", "inputs"),
            ("extra", 400, "invalid_parameter", "model"),
            ("unknown", 404, None, None),
        ]:
            response = failed[custom_id]["response"]
            assert response["status_code"] == status, response
            error = response["body"]["error"]
            assert (code is None or error["code"] == code) and (param is None or error["param"] == param), error
            live = http.post(SCORE, json=next(r["body"] for r in records if r["custom_id"] == custom_id))
            assert live.status_code == status and live.json()["error"]["code"] == error["code"]
        # nothing scored in a batch is stored, as nothing the route scores is
        assert http.get("/api/probes/events", params={"limit": 1}).json()["data"] == events


def test_a_batch_names_a_registered_endpoint(probes_server):
    with probes_server.http() as http:
        refused = http.post(
            "/v1/batches",
            json={"input_file_id": "file-x", "endpoint": "/api/probes/events", "completion_window": "24h"},
        )
        assert_error(refused, 400, "invalid_parameter", "endpoint")
        message = refused.json()["error"]["message"]
        assert all(url in message for url in ("/v1/chat/completions", "/v1/embeddings", SCORE)), message
        document = http.get("/openapi.json").json()
    schema = document["paths"]["/v1/batches"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    name = schema["$ref"].rsplit("/", 1)[1]
    endpoint = document["components"]["schemas"][name]["properties"]["endpoint"]
    assert endpoint["enum"] == ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", SCORE], endpoint
