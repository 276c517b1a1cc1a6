"""The bounded queue, disconnects, and model management (load on demand, graceful unload, refusals).

Loads, refusals and listings run in-process on echo models; the queue, disconnects
and the graceful unload, which need a request that runs for a long time, in-process
on tiny models with the transformers engine.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from millm_host.testing import assert_error, chat, chat_body
from millm_host.testing.tiny_models import tiny_llama


@pytest.fixture(scope="module")
def long_model() -> Path:
    """A tiny model with a long window, so one request can generate for a long time."""
    return tiny_llama("tiny-long", max_position_embeddings=8192)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, long_model) -> Path:
    """Models on disk: a second tiny model."""
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(tiny_llama("tiny-other", seed=1, max_position_embeddings=8192), root / "tiny-other")
    return root


@pytest.fixture(scope="module")
def server(app_factory, long_model, models_dir):
    env = {"MILLM_QUEUE_MAX": "0", "MILLM_MODELS_DIR": str(models_dir), "GRACEFUL_UNLOAD_TIMEOUT": "60"}
    return app_factory(plugins=["engine_transformers"], checkpoint=long_model, env=env)


class LongStream:
    """A streamed request that would generate for a long time; closing it disconnects."""

    def __init__(self, server, model: str) -> None:
        self.client = httpx.Client(timeout=120)
        body = chat_body(model, max_tokens=8000, temperature=1, seed=1, stream=True)
        self._cm = self.client.stream("POST", f"{server.v1}/chat/completions", json=body)
        self.response = self._cm.__enter__()
        assert self.response.status_code == 200, self.response.read()
        self.lines = self.response.iter_lines()
        for line in self.lines:  # wait for the first generated token
            if '"content":"' in line and '"content":""' not in line:
                break

    def close(self) -> None:
        self._cm.__exit__(None, None, None)
        self.client.close()


def _tokens_per_second(server, model: str) -> float:
    start = time.perf_counter()
    reply = server.openai().chat.completions.create(
        model=model, messages=[{"role": "user", "content": "go"}], max_tokens=200, temperature=1, seed=2
    )
    return reply.usage.completion_tokens / (time.perf_counter() - start)


def test_queue_full_then_disconnect_frees_the_slot(server):
    model = server.model_id
    rate = _tokens_per_second(server, model)
    stream = LongStream(server, model)
    try:
        with server.http() as http:
            busy = http.post("/v1/chat/completions", json=chat_body(model, max_tokens=1))
        assert_error(busy, 503, "queue_full")
    finally:
        disconnected = time.perf_counter()
        stream.close()
    with server.http() as http:
        while True:
            response = http.post("/v1/chat/completions", json=chat_body(model, max_tokens=1))
            if response.status_code == 200 or time.perf_counter() - disconnected > 30:
                break
            time.sleep(0.05)
    waited = time.perf_counter() - disconnected
    assert response.status_code == 200, response.text
    # The abandoned generation had most of 8,000 tokens left: far longer than we waited.
    assert waited < (8000 / rate) / 4, (waited, rate)


def test_graceful_unload_refuses_new_requests_and_waits(server):
    model = "tiny-other"
    with server.http() as http:
        http.post(f"/api/models/{model}/load").raise_for_status()
    stream = LongStream(server, model)
    unload_result: dict = {}

    def unload() -> None:
        with server.http() as http:
            unload_result["response"] = http.post(f"/api/models/{model}/unload")

    worker = threading.Thread(target=unload)
    worker.start()
    try:
        with server.http() as http:
            for _ in range(100):  # until the unload has begun
                if http.get(f"/api/models/{model}").json()["state"] == "UNLOADING":
                    break
                time.sleep(0.05)
            busy = http.post("/v1/chat/completions", json=chat_body(model, max_tokens=1))
            other_model = next(
                m["id"] for m in http.get("/api/models").json()["data"] if m["id"].startswith("tiny-long")
            )
            other = http.post("/v1/chat/completions", json=chat_body(other_model, max_tokens=1))
        assert_error(busy, 503, "model_busy", "model")
        assert_error(other, 503, "model_busy", "model")  # no second transition while one runs
        # The running request was not cut: it still streams.
        assert any(line.startswith("data: ") for _, line in zip(range(5), stream.lines, strict=False))
        assert worker.is_alive()
    finally:
        stream.close()
    worker.join(60)
    assert unload_result["response"].status_code == 200
    assert unload_result["response"].json()["state"] == "READY"


@pytest.fixture(scope="module")
def models_app(app_factory):
    """In-process: two echo models, one that fails to load, one too big for memory."""
    app = app_factory(
        models={"echo": {}, "echo-other": {}, "broken-model": {"load_error": "not a checkpoint"}, "huge-model": {}}
    )
    with open(app.models_dir / "huge-model" / "model.safetensors", "wb") as f:  # sparse: 4 TiB on paper
        f.truncate(4 * 2**40)
    return app


def test_request_for_another_model_loads_it(models_app):
    with models_app.http() as http:
        listed = {m["id"] for m in http.get("/v1/models").json()["data"]}
        assert listed == {"echo", "echo-other", "huge-model", "broken-model"}
        reply = chat(http, "echo-other", max_tokens=1)
        assert reply.status_code == 200 and reply.json()["model"] == "echo-other"
        states = {m["id"]: m["state"] for m in http.get("/api/models").json()["data"]}
        assert states["echo-other"] == "LOADED" and states["echo"] == "READY"
        back = chat(http, "echo", max_tokens=1)
        assert back.status_code == 200 and models_app.model_id == "echo"


def test_load_refused_before_unload_keeps_the_resident_model(models_app):
    resident = models_app.model_id
    with models_app.http() as http:
        response = chat(http, "huge-model", max_tokens=1)
        error = assert_error(response, 503, "insufficient_memory", "model")
        assert "GiB" in error["message"]
        assert http.get("/api/health").json()["model"] == resident


def test_failed_load_is_500_and_reported(models_app):
    with models_app.http() as http:
        response = chat(http, "broken-model", max_tokens=1)
        error = assert_error(response, 500, "model_load_failed")
        assert "not a checkpoint" in error["message"]
        states = {m["id"]: m for m in http.get("/api/models").json()["data"]}
        assert states["broken-model"]["state"] == "FAILED" and states["broken-model"]["error"]
        assert "broken-model" not in {m["id"] for m in http.get("/v1/models").json()["data"]}
        # The app recovers: a request for a good model loads it.
        assert chat(http, "echo-other", max_tokens=1).status_code == 200


def test_model_not_loaded_without_autoload(app_factory):
    app = app_factory(env={"MILLM_AUTOLOAD": "false"})
    with app.http() as http:
        http.post("/api/models/echo/unload").raise_for_status()
        response = chat(http, "echo", max_tokens=1)
        assert_error(response, 503, "model_not_loaded", "model")
        assert http.get("/api/health").json()["status"] == "no_model"
        http.post("/api/models/echo/load").raise_for_status()
        assert chat(http, "echo", max_tokens=1).status_code == 200


def test_v1_models_lists_ready_loaded_and_loading_only(models_app):
    with models_app.http() as http:
        detail = {m["id"]: m["state"] for m in http.get("/api/models").json()["data"]}
        listed = {m["id"] for m in http.get("/v1/models").json()["data"]}
    assert listed == {m for m, state in detail.items() if state in ("READY", "LOADED", "LOADING")}
