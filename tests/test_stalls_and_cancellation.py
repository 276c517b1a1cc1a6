"""Stalls, cancellation and shutdown: clients that leave, generations that hang, SIGTERM.

Generations are held still with the fault-injection plugin: ``slow:N:S`` blocks a
request that mentions FAULT at its N-th token until it is cancelled (at most S
seconds), ``stall:N:S`` blocks there for S seconds whatever happens (a hung
engine thread). S is far longer than any wait here, so a test that passes never
got there by waiting the block out.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from millm_host.testing import assert_error, chat_body, stream_post
from millm_host.testing.replicas import wait_until
from millm_host.testing.tiny_models import tiny_llama

BLOCK_S = 120  # how long a FAULT request blocks the engine thread unless cancelled


@pytest.fixture(scope="module")
def long_model() -> Path:
    return tiny_llama("tiny-long", max_position_embeddings=8192)


@pytest.fixture(scope="module")
def server(server_factory, long_model):
    """16 may wait; a FAULT request holds the engine thread at its 2nd token until it is cancelled."""
    return server_factory(long_model, env={"MILLM_QUEUE_MAX": "16", "FAULT_INJECTION": f"slow:2:{BLOCK_S}"})


def health(server) -> dict:
    return httpx.get(f"{server.base_url}/api/health", timeout=30).json()


class HeldStream:
    """A FAULT stream whose generation is holding the engine thread; closing it disconnects."""

    def __init__(self, server) -> None:
        self.client = httpx.Client(timeout=30)
        body = chat_body(server.model_id, content="FAULT", max_tokens=50, stream=True)
        self._cm = self.client.stream("POST", f"{server.v1}/chat/completions", json=body)
        self.response = self._cm.__enter__()
        assert self.response.status_code == 200, self.response.read()
        wait_until(lambda: health(server)["queue"]["generating"], "the generation to start", interval=0.05)

    def close(self) -> None:
        self._cm.__exit__(None, None, None)
        self.client.close()


def test_streams_that_leave_free_their_places_at_once(server):
    """Behind a running generation, 16 clients open a stream and leave; 16 more are then all admitted."""
    model = server.model_id
    url = f"{server.v1}/chat/completions"

    def open_and_leave(_: int) -> str:
        with httpx.Client(timeout=30) as client:
            with client.stream("POST", url, json=chat_body(model, max_tokens=50, stream=True)) as response:
                if response.status_code != 200:
                    return response.read().decode()
                return "admitted"  # leaves as soon as the stream is open, still queued

    held = HeldStream(server)  # holds the engine thread: the streams below wait behind it
    try:
        with ThreadPoolExecutor(16) as pool:
            assert list(pool.map(open_and_leave, range(16))) == ["admitted"] * 16
            left = time.perf_counter()
            wait_until(lambda: health(server)["queue"]["admitted"] == 1, "the places to be freed", interval=0.05)
            freed = time.perf_counter() - left
            assert list(pool.map(open_and_leave, range(16))) == ["admitted"] * 16  # no 503 queue_full
    finally:
        held.close()
    wait_until(lambda: health(server)["queue"]["admitted"] == 0, "every place to be free", interval=0.05)
    print(f"16 queued streams whose clients left: places free {freed * 1000:.0f} ms after the last left")


def test_a_non_streamed_request_is_cancelled_when_its_client_leaves(server):
    """The held generation is cancelled and its place freed: the next request is served at once."""
    body = json.dumps(chat_body(server.model_id, content="FAULT", max_tokens=50)).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n" + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        wait_until(lambda: health(server)["queue"]["generating"], "the generation to start", interval=0.05)
    # Not cancelled, it would hold its place and the engine thread for BLOCK_S seconds.
    wait_until(lambda: health(server)["queue"]["admitted"] == 0, "the place to be freed", timeout=30, interval=0.05)
    with server.http(timeout=30) as http:
        response = http.post("/v1/chat/completions", json=chat_body(server.model_id, max_tokens=1))
    assert response.status_code == 200, response.text
    assert not health(server)["queue"]["generating"]


def test_a_tokenizer_refusal_does_not_wait_behind_a_generation(server):
    held = HeldStream(server)
    try:
        started = time.perf_counter()
        with server.http(timeout=30) as http:  # the held generation would answer only after BLOCK_S
            too_long = http.post("/v1/chat/completions", json=chat_body(server.model_id, max_tokens=9000))
        took = time.perf_counter() - started
        assert_error(too_long, 400, "context_length_exceeded", "max_tokens")
        assert health(server)["queue"]["generating"]  # refused while the generation still runs
        print(f"context_length_exceeded answered in {took * 1000:.0f} ms beside a running generation")
    finally:
        held.close()


def test_503_answers_say_when_to_retry(server_factory, long_model):
    busy = server_factory(long_model, env={"MILLM_QUEUE_MAX": "0", "FAULT_INJECTION": f"slow:2:{BLOCK_S}"})
    held = HeldStream(busy)
    try:
        with busy.http() as http:
            refused = http.post("/v1/chat/completions", json=chat_body(busy.model_id, max_tokens=1))
        assert_error(refused, 503, "queue_full")
        assert int(refused.headers["retry-after"]) >= 1
    finally:
        held.close()


def _post_in_thread(server, body: dict, results: dict, key: str) -> threading.Thread:
    def run() -> None:
        with server.http(timeout=120) as http:
            if body.get("stream"):
                results[key] = stream_post(http, "/v1/chat/completions", body)
            else:
                results[key] = http.post("/v1/chat/completions", json=body)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_sigterm_waits_the_grace_then_fails_the_rest(server_factory, long_model):
    server = server_factory(
        long_model, env={"MILLM_QUEUE_MAX": "16", "FAULT_INJECTION": f"slow:2:{BLOCK_S}", "MILLM_SHUTDOWN_GRACE_S": "1"}
    )
    model = server.model_id
    results: dict = {}
    threads = [_post_in_thread(server, chat_body(model, content="FAULT", max_tokens=50, stream=True), results, "held")]
    wait_until(lambda: health(server)["queue"]["generating"], "the generation to start", interval=0.05)
    threads += [
        _post_in_thread(server, chat_body(model, max_tokens=50, stream=True), results, f"queued-{i}") for i in range(2)
    ]
    # Short: once the grace ends it would finish in a few ms if let go before its own cancellation.
    threads.append(_post_in_thread(server, chat_body(model, max_tokens=2), results, "plain"))
    wait_until(lambda: health(server)["queue"]["admitted"] == 4, "four admitted requests", interval=0.05)
    signalled = time.monotonic()
    os.killpg(server.proc.pid, signal.SIGTERM)
    try:
        server.proc.wait(60)  # without a bound it would wait BLOCK_S for the held generation
    except subprocess.TimeoutExpired:
        pytest.fail(f"millm serve still running 60 s after SIGTERM:\n{server.log()}")
    exited = time.monotonic() - signalled
    for thread in threads:
        thread.join(30)
    for key in ("held", "queued-0", "queued-1"):
        response, events = results[key]
        assert response.status_code == 200
        assert events[-1] == "[DONE]", (key, events[-3:])
        assert events[-2]["error"]["code"] == "shutting_down", (key, events[-2])
    assert_error(results["plain"], 503, "shutting_down")
    print(f"exited {exited:.1f} s after SIGTERM (grace 1 s)")


def test_after_sigterm_new_requests_get_503_until_the_listener_closes(server_factory, long_model):
    """The listener stays open while an admitted request finishes: a new connection is answered
    503 shutting_down (health still answers), not refused at TCP; it closes once nothing is left."""
    server = server_factory(
        long_model,
        env={"MILLM_QUEUE_MAX": "16", "FAULT_INJECTION": f"slow:2:{BLOCK_S}", "MILLM_SHUTDOWN_GRACE_S": "30"},
    )
    held = HeldStream(server)  # admitted and generating: the drain lasts until it ends
    try:
        os.killpg(server.proc.pid, signal.SIGTERM)
        wait_until(lambda: health(server)["queue"]["shutting_down"], "the shutdown to begin", interval=0.05)
        with httpx.Client(base_url=server.base_url, timeout=30) as http:  # a new connection
            refused = http.post("/v1/chat/completions", json=chat_body(server.model_id, max_tokens=1))
            assert_error(refused, 503, "shutting_down")  # with Retry-After, as every 503
            assert_error(http.get("/v1/models"), 503, "shutting_down")
            assert_error(http.get("/api/health/ready"), 503, "not_ready")
            assert http.get("/api/health/live").status_code == 200
        assert server.proc.poll() is None
    finally:
        held.close()  # its generation is cancelled: nothing admitted is left
    closed = time.monotonic()
    try:
        server.proc.wait(30)  # well inside the 30 s grace: the drain ended when the last request did
    except subprocess.TimeoutExpired:
        pytest.fail(f"millm serve still running 30 s after its last request ended:\n{server.log()}")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.base_url}/api/health/live", timeout=5)
    print(f"exited {time.monotonic() - closed:.1f} s after the last admitted request ended")


def test_a_stalled_generation_fails_with_503(server_factory, tiny_model_dir):
    """No token for MILLM_GENERATION_STALL_S: 503; what waits behind the hung thread fails too; SIGTERM still exits."""
    server = server_factory(
        tiny_model_dir,
        env={"FAULT_INJECTION": "stall:2:600", "MILLM_GENERATION_STALL_S": "1", "MILLM_SHUTDOWN_GRACE_S": "1"},
    )
    model = server.model_id
    with server.http(timeout=60) as http:
        hung = http.post("/v1/chat/completions", json=chat_body(model, content="FAULT", max_tokens=20))
        assert "no progress" in assert_error(hung, 503, "generation_stalled")["message"]
        assert int(hung.headers["retry-after"]) >= 1
        assert health(server)["queue"]["stalled"]
        # The engine thread is still stuck: requests that would wait behind it fail instead of waiting.
        response, events = stream_post(http, "/v1/chat/completions", chat_body(model, max_tokens=5, stream=True))
        assert response.status_code == 200
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "generation_stalled", events[-2:]
        assert_error(http.post("/v1/chat/completions", json=chat_body(model, max_tokens=5)), 503, "generation_stalled")
    signalled = time.monotonic()
    os.killpg(server.proc.pid, signal.SIGTERM)
    try:
        server.proc.wait(60)  # the hung thread must not keep the process alive
    except subprocess.TimeoutExpired:
        pytest.fail(f"millm serve still running 60 s after SIGTERM:\n{server.log()}")
    print(f"exited {time.monotonic() - signalled:.1f} s after SIGTERM with a hung engine thread")
