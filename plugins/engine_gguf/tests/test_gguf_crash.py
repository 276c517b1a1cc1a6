"""A native crash in llama.cpp fails the requests in flight, never the server.

A real ``millm serve --engine gguf``: its llama.cpp child process is killed with
SIGSEGV (as a crash in llama.cpp ends it) mid-stream and mid-request. The
request in flight gets ``503 engine_crashed`` (a stream: an error event, then
``[DONE]``), the next request is served by the restarted child, and
``/api/health`` counts the restart and names the signal.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from .conftest import DEFAULT_ID, N_CTX, THREADS

#: A prompt SmolLM2 counts on from, greedily, for the whole window: a generation long enough to be cut.
COUNTING = {"model": DEFAULT_ID, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 400, "temperature": 0}
SHORT = {**COUNTING, "max_tokens": 8}


@pytest.fixture(scope="module")
def crash_server(server_factory):
    """A server of its own: these tests kill its engine process."""
    return server_factory(env={"GGUF_N_CTX": str(N_CTX), **THREADS}, args=["--engine", "gguf"])


def engine_status(server) -> dict:
    return httpx.get(f"{server.base_url}/api/health", timeout=30).json()["engine_status"]


def wait_for(condition, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def assert_engine_crashed(error: dict) -> None:
    assert error["code"] == "engine_crashed" and error["type"] == "server_error" and error["param"] is None
    assert "SIGSEGV" in error["message"]


def assert_restarted(server, before: dict) -> None:
    after = wait_for(lambda: (s := engine_status(server))["state"] == "running" and s, "the engine restarts")
    assert after["restarts"] == before["restarts"] + 1
    assert after["last_signal"] == "SIGSEGV" and after["pid"] != before["pid"]
    assert not alive(before["pid"])


def test_sigsegv_mid_stream_ends_the_stream_with_an_error_event_then_the_next_request_is_served(crash_server):
    with crash_server.http() as client:
        expected = client.post("/v1/completions", json=SHORT).json()["choices"][0]["text"]
        before = engine_status(crash_server)
        with client.stream("POST", "/v1/completions", json={**COUNTING, "stream": True}) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            for line in lines:  # the first token is out: the child is generating
                if line.startswith("data: "):
                    break
            os.kill(before["pid"], signal.SIGSEGV)
            events = data_events(lines)
        assert events[-1] == "[DONE]"
        assert_engine_crashed(events[-2]["error"])
        assert all("choices" in e for e in events[:-2])  # tokens before the crash, nothing after
        assert len(events) < COUNTING["max_tokens"]
        # Sent at once: it waits for the restart, then is served.
        reply = client.post("/v1/completions", json=SHORT)
        assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == expected
    assert_restarted(crash_server, before)


def data_events(lines) -> list:
    """The rest of an SSE stream's ``data:`` payloads (``sse_events`` reads a response from its start)."""
    return [json.loads(p) if p != "[DONE]" else p for p in (x[6:] for x in lines if x.startswith("data: "))]


def test_sigsegv_mid_request_is_a_503_with_retry_after_then_the_next_request_is_served(crash_server):
    before = engine_status(crash_server)
    result: dict = {}

    def request() -> None:
        with crash_server.http() as client:
            result["response"] = client.post("/v1/completions", json=COUNTING)

    thread = threading.Thread(target=request)
    thread.start()
    wait_for(lambda: engine_status(crash_server)["generating"], "the request reaches the engine process")
    os.kill(before["pid"], signal.SIGSEGV)
    thread.join(120)
    response = result["response"]
    assert response.status_code == 503
    assert_engine_crashed(response.json()["error"])
    assert int(response.headers["retry-after"]) >= 1
    with crash_server.http() as client:
        reply = client.post(
            "/v1/chat/completions",
            json={
                "model": DEFAULT_ID,
                "messages": [{"role": "user", "content": "Say hello."}],
                "temperature": 0,
                "max_tokens": 8,
            },
        )
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
    assert_restarted(crash_server, before)


def test_health_reports_the_engine_process(crash_server):
    status = engine_status(crash_server)
    assert status["process"] == "child" and status["state"] == "running"
    assert alive(status["pid"]) and status["pid"] != crash_server.proc.pid
    assert {"restarts", "last_signal", "last_exit", "generating"} <= set(status)


def test_the_engine_process_never_outlives_the_server(server_factory):
    server = server_factory(
        env={"GGUF_N_CTX": str(N_CTX), "GGUF_ENABLE_EMBEDDINGS": "false", **THREADS}, args=["--engine", "gguf"]
    )
    child = engine_status(server)["pid"]
    os.kill(server.proc.pid, signal.SIGKILL)  # no shutdown: only the child's own watch can end it
    server.proc.wait(30)
    wait_for(lambda: not alive(child), "the orphaned engine process leaves", timeout=30)
