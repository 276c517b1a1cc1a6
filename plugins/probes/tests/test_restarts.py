"""Requests the host ends (shutdown, a hung generation) are recorded; kill -9 loses nothing already written.

Each test runs its own servers on one data directory, restarting between them.
The fault-injection test plugin holds a FAULT request's generation still:
``slow:N:S`` until it is cancelled, ``stall:N:S`` whatever happens (a hung thread).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from typing import Any

import httpx

from millm_host.testing import databases
from millm_saelens.testing import write_sae

CHAT = [{"role": "user", "content": "FAULT: tell me a long story about a lighthouse keeper."}]
TRACE_CANCELLED = "1af7651916cd43dd8448eb211c80319c"
TRACE_HUNG = "2af7651916cd43dd8448eb211c80319c"
TRACE_KILLED = "3af7651916cd43dd8448eb211c80319c"


def traceparent(trace: str) -> dict[str, str]:
    return {"traceparent": f"00-{trace}-b7ad6b7169203331-01"}


def wait_for(condition, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return result


def events_of(http: httpx.Client, trace: str) -> list[dict[str, Any]]:
    return http.get("/api/probes/events", params={"trace_id": trace, "limit": 200}).json()["data"]


def generating(http: httpx.Client) -> bool:
    return http.get("/api/health").json()["queue"]["generating"]


def stream_in_thread(server, trace: str, results: dict) -> threading.Thread:
    """A FAULT stream read to its end in a thread (``results["lines"]``; ``results["error"]`` if it broke)."""

    def run() -> None:
        with server.http(timeout=120) as http:
            try:
                with http.stream(
                    "POST",
                    "/v1/chat/completions",
                    headers=traceparent(trace),
                    json={"model": server.model_id, "messages": CHAT, "max_tokens": 200, "stream": True},
                ) as response:
                    results["lines"] = [line for line in response.iter_lines() if line.startswith("data: ")]
            except httpx.HTTPError as exc:  # the server was killed mid-stream
                results["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_shutdown_and_a_hung_generation_are_recorded(server_factory, probe_model_dir, lab, helpers, tmp_path):
    data_dir = tmp_path / "data"
    first = server_factory(
        probe_model_dir, data_dir=data_dir, env={"FAULT_INJECTION": "slow:3:120", "MILLM_SHUTDOWN_GRACE_S": "1"}
    )
    with first.http() as http:
        identity = http.get(f"/api/models/{first.model_id}").json()
        probe = helpers.import_probe(http, lab.definition(identity, name="watch", windows=["all", "response"]))
        helpers.arm(http, probe["id"])
        results: dict = {}
        thread = stream_in_thread(first, TRACE_CANCELLED, results)
        wait_for(lambda: generating(http), "the generation to start")
    os.killpg(first.proc.pid, signal.SIGTERM)
    first.proc.wait(60)
    thread.join(30)
    assert results["lines"][-1] == "data: [DONE]" and '"shutting_down"' in results["lines"][-2]

    second = server_factory(
        probe_model_dir,
        data_dir=data_dir,
        env={"FAULT_INJECTION": "stall:3:600", "MILLM_GENERATION_STALL_S": "1", "MILLM_SHUTDOWN_GRACE_S": "1"},
    )
    with second.http(timeout=60) as http:
        cancelled = events_of(http, TRACE_CANCELLED)  # written by the first process as it stopped
        assert len(cancelled) == 2
        assert {(e["outcome"], e["reason"]) for e in cancelled} == {("interrupted", "cancelled")}
        helpers.arm(http, probe["id"])  # a restart disarms
        hung = http.post(
            "/v1/chat/completions",
            headers=traceparent(TRACE_HUNG),
            json={"model": second.model_id, "messages": CHAT, "max_tokens": 50},
        )
        assert hung.status_code == 503 and hung.json()["error"]["code"] == "generation_stalled"
        # The engine thread stays stuck for 600 s: the host records the result itself.
        hung_events = wait_for(lambda: events_of(http, TRACE_HUNG), "the hung request's results", timeout=30)
        assert len(hung_events) == 2
        for event in hung_events:
            assert (event["outcome"], event["reason"]) == ("interrupted", "generation_thread_hung")
            assert event["status"] in ("partial", "unavailable") and "verdict" not in event


def test_kill_9_mid_request_loses_nothing_written(server_factory, probe_model_dir, lab, helpers, tmp_path):
    data_dir = tmp_path / "data"
    sae_path = write_sae(tmp_path / "saes" / "kill-sae", d_in=lab.d_model, d_sae=128, layer=1)
    sae_dirs = {"MILLM_SAE_DIRS": str(tmp_path / "saes")}
    server = server_factory(probe_model_dir, data_dir=data_dir, env={"FAULT_INJECTION": "slow:3:120", **sae_dirs})
    with server.http() as http:
        model = server.model_id
        identity = http.get(f"/api/models/{model}").json()
        http.post("/api/saes", json={"path": str(sae_path), "sae_id": "kill-sae"}).raise_for_status()
        http.post(
            "/api/profiles", json={"name": "calm", "sae_id": "kill-sae", "features": [{"index": 3, "strength": 2.0}]}
        ).raise_for_status()
        probe = helpers.import_probe(http, lab.definition(identity, name="kept"))
        helpers.arm(http, probe["id"])
        for _ in range(3):
            reply = http.post(
                "/v1/chat/completions",
                headers=traceparent(TRACE_KILLED),
                json={"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3},
            )
            assert reply.status_code == 200, reply.text
        before = {
            "saes": http.get("/api/saes").json()["data"],
            "profiles": http.get("/api/profiles").json()["data"],
            "probes": [p["id"] for p in http.get("/api/probes").json()["data"]],
            "events": [e["result_id"] for e in events_of(http, TRACE_KILLED)],
        }
        assert len(before["events"]) == 3
        results: dict = {}
        thread = stream_in_thread(server, "4af7651916cd43dd8448eb211c80319c", results)
        wait_for(lambda: generating(http), "the generation to start")
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(30)
    thread.join(30)
    assert "error" in results  # it was cut mid-stream

    if databases.backend() == "sqlite":  # PostgreSQL has no such check; its WAL recovery is its own
        with sqlite3.connect(data_dir / "millm.sqlite3") as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    restarted = server_factory(probe_model_dir, data_dir=data_dir, env=sae_dirs)
    with restarted.http() as http:
        assert http.get("/api/saes").json()["data"] == before["saes"]
        assert http.get("/api/profiles").json()["data"] == before["profiles"]
        assert [p["id"] for p in http.get("/api/probes").json()["data"]] == before["probes"]
        assert [e["result_id"] for e in events_of(http, TRACE_KILLED)] == before["events"]
        reply = http.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3},
        )
        assert reply.status_code == 200
    assert "Traceback" not in restarted.log()
