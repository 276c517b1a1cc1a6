"""OpenTelemetry: a real server exports a span per request, joined to the caller's traceparent, to an OTLP receiver."""

from __future__ import annotations

import pytest

from millm_host.testing.otlp import OtlpReceiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
SERVER = 2  # SpanKind.SPAN_KIND_SERVER in OTLP


@pytest.fixture(scope="module")
def traced(server_factory, tiny_model_dir):
    with OtlpReceiver() as receiver:
        server = server_factory(
            tiny_model_dir,
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"},
        )
        yield server, receiver
        server.stop()


def spans_of(spans, trace_id: str) -> dict[str, dict]:
    return {s["name"]: s for s in spans if s["trace_id"] == trace_id}


def test_a_request_span_joins_the_callers_trace_with_queue_prefill_and_decode(traced):
    server, receiver = traced
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    with server.http() as http:
        reply = http.post(
            "/v1/chat/completions",
            headers=headers,
            json={"model": server.model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
    assert reply.status_code == 200
    usage = reply.json()["usage"]
    found = receiver.wait_for(lambda spans: len(spans_of(spans, TRACE_ID)) >= 4 and spans_of(spans, TRACE_ID))
    request = found["chat.completions"]
    assert request["parent_span_id"] == PARENT_ID and request["kind"] == SERVER
    assert request["resource"]["service.name"] == "millm"
    attributes = request["attributes"]
    assert attributes["gen_ai.request.model"] == server.model_id
    assert attributes["http.response.status_code"] == 200
    assert attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert len(attributes["millm.request_id"]) == 32
    queue, prefill, decode = found["queue"], found["prefill"], found["decode"]
    for child in (queue, prefill, decode):
        assert child["parent_span_id"] == request["span_id"]
        assert request["start"] <= child["start"] <= child["end"] <= request["end"]
    assert queue["end"] <= prefill["start"] and prefill["end"] == decode["start"]


def test_a_stream_and_a_refusal_are_spans_too(traced):
    server, receiver = traced
    other = "a" * 32
    with server.http() as http:
        with http.stream(
            "POST",
            "/v1/chat/completions",
            headers={"traceparent": f"00-{other}-{PARENT_ID}-01"},
            json={"model": server.model_id, "messages": [{"role": "user", "content": "hi"}], "stream": True},
        ) as stream:
            assert stream.status_code == 200
            stream.read()
        refused = http.post(
            "/v1/chat/completions",
            headers={"traceparent": f"00-{'b' * 32}-{PARENT_ID}-01"},
            json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert refused.status_code == 404
    streamed = receiver.wait_for(lambda spans: spans_of(spans, other).get("chat.completions"))
    assert (
        streamed["attributes"]["millm.streaming"] is True and streamed["attributes"]["gen_ai.usage.output_tokens"] > 0
    )
    failed = receiver.wait_for(lambda spans: spans_of(spans, "b" * 32).get("chat.completions"))
    assert failed["attributes"]["http.response.status_code"] == 404
