"""Structured logs: ``MILLM_LOG_FORMAT=json`` gives JSON lines with the request's id and trace id."""

from __future__ import annotations

import asyncio
import json

from millm_host.observability.request import CURRENT
from millm_host.scheduler import Scheduler

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_request_log_line_names_the_request_and_its_trace(server_factory, tiny_model_dir):
    # a plugin whose render_headers fails logs an error while the request is served
    server = server_factory(tiny_model_dir, env={"MILLM_LOG_FORMAT": "json", "FAULT_INJECTION": "rendering"})
    with server.http() as http:
        reply = http.post(
            "/v1/chat/completions",
            headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
            json={"model": server.model_id, "messages": [{"role": "user", "content": "FAULT"}], "max_tokens": 2},
        )
    assert reply.status_code == 200
    lines = json_lines(server.log())
    assert any(line["logger"] == "millm" and "serving" in line["message"] for line in lines)  # startup, no request
    failed = [line for line in lines if "failed in render_headers" in line["message"]]
    assert failed, server.log()
    line = failed[0]
    assert line["level"] == "ERROR" and line["trace_id"] == TRACE_ID and "exception" in line
    assert len(line["request_id"]) == 32
    # uvicorn's own lines are JSON too
    assert any(line["logger"].startswith("uvicorn") for line in lines)


def test_engine_thread_work_runs_in_the_requests_context():
    scheduler = Scheduler(queue_max=1)
    marker = object()

    async def run() -> object:
        token = CURRENT.set(marker)  # type: ignore[arg-type]
        try:
            return await scheduler.run(CURRENT.get)
        finally:
            CURRENT.reset(token)

    try:
        assert asyncio.run(run()) is marker
        assert scheduler.run_sync(CURRENT.get) is None  # submitted outside any request
    finally:
        scheduler.shutdown()
