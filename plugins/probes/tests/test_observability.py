"""Probe results reach the operator's tools: verdict and overhead metrics, and ``mi.probe.result/v1`` span events."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from millm_host.testing.otlp import OtlpReceiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CHAT = [{"role": "user", "content": "Tell me about lighthouses."}]


def samples(http) -> dict[tuple[str, tuple], float]:
    text = http.get("/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture(scope="module")
def traced(app_factory, probe_model_dir, sae_dir, lab, helpers):
    """An app of its own that exports spans to a receiver, with one armed probe (threshold 0: it fires or not)."""
    with OtlpReceiver() as receiver:
        app = app_factory(
            plugins="all",
            models={},
            model=str(probe_model_dir),
            env={
                "PROBE_SAE_DIR": str(sae_dir),
                "MILLM_SAE_DIRS": str(sae_dir),
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                "OTEL_BSP_SCHEDULE_DELAY": "50",
            },
        )
        with app.http() as http:
            model_id = http.get("/api/health").json()["model"]
            identity = http.get(f"/api/models/{model_id}").json()
            probe = helpers.import_probe(http, lab.definition(identity, name="watch", behaviour="high-stakes"))
            helpers.arm(http, probe["id"])
        yield app, receiver, model_id


def test_verdicts_overhead_and_span_events(traced):
    app, receiver, model_id = traced
    with app.http() as http:
        before = samples(http)
        reply = http.post(
            "/v1/chat/completions",
            headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
            json={"model": model_id, "messages": CHAT, "max_tokens": 4, "temperature": 0},
        )
        after = samples(http)
    assert reply.status_code == 200, reply.text
    results = reply.json()["millm_probe_verdicts"]
    reached = [r for r in results if "verdict" in r]
    assert reached, results

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    for verdict in (True, False):
        expected = sum(1 for r in reached if r["verdict"] is verdict)
        got = grew("millm_probe_verdicts_total", behaviour="high-stakes", probe="watch", verdict=str(verdict).lower())
        assert got == expected
    assert grew("millm_probe_overhead_seconds_count") == 1

    span = receiver.wait_for(
        lambda spans: next((s for s in spans if s["trace_id"] == TRACE_ID and s["name"] == "chat.completions"), None)
    )
    events = [e for e in span["events"] if e["name"] == "mi.probe.result/v1"]
    assert [e["attributes"]["result_id"] for e in events] == [r["result_id"] for r in results]
    for event, result in zip(events, results, strict=True):
        attributes = event["attributes"]
        assert attributes["schema"] == "mi.probe.result/v1" and attributes["probe_id"] == result["probe_id"]
        assert attributes["trace_id"] == TRACE_ID  # the probe's trace is the request's
        assert attributes.get("verdict") == result.get("verdict")
        assert not {"text", "content", "messages", "prompt"} & set(attributes)


def test_a_result_names_the_requests_span_without_a_traceparent(traced):
    app, receiver, model_id = traced
    with app.http() as http:
        reply = http.post("/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    results = reply.json()["millm_probe_verdicts"]
    [request_id] = {r["request_id"] for r in results}
    [trace_id] = {r["trace_id"] for r in results}
    span = receiver.wait_for(
        lambda spans: next((s for s in spans if s["attributes"].get("millm.request_id") == request_id), None)
    )
    assert span["trace_id"] == trace_id  # the trace the request ran in, not one minted beside it
    events = [e for e in span["events"] if e["name"] == "mi.probe.result/v1"]
    assert {e["attributes"]["trace_id"] for e in events} == {trace_id}


def test_every_json_log_line_of_a_request_joins_its_results(server_factory, probe_model_dir, lab, helpers):
    """``millm serve`` with JSON logs: each line written for a request, uvicorn's access line included, names
    the request and the trace its results name; with a ``traceparent``, the caller's trace."""
    server = server_factory(probe_model_dir, env={"MILLM_LOG_FORMAT": "json"})
    with server.http() as http:
        identity = http.get(f"/api/models/{server.model_id}").json()
        helpers.arm(http, helpers.import_probe(http, lab.definition(identity, name="logged"))["id"])
        minted = http.post("/v1/chat/completions", json={"model": server.model_id, "messages": CHAT, "max_tokens": 2})
        joined = http.post(
            "/v1/chat/completions",
            headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
            json={"model": server.model_id, "messages": CHAT, "max_tokens": 2},
        )
    ids = []
    for reply in (minted, joined):
        assert reply.status_code == 200, reply.text
        results = reply.json()["millm_probe_verdicts"]
        [pair] = {(r["request_id"], r["trace_id"]) for r in results}
        ids.append(pair)
    assert ids[1][1] == TRACE_ID and ids[0][1] != TRACE_ID
    lines = [json.loads(x) for x in server.log_path.read_text().splitlines() if x.startswith("{")]
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert access and all(len(line["request_id"]) == 32 and len(line["trace_id"]) == 32 for line in access)
    chats = [line for line in access if "POST /v1/chat/completions" in line["message"]]
    assert [(line["request_id"], line["trace_id"]) for line in chats] == ids
    for request_id, trace_id in ids:
        written = [line for line in lines if line.get("request_id") == request_id]
        assert {line["trace_id"] for line in written} == {trace_id}
