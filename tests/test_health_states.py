"""``/api/health`` tells the truth in every state the model registry can be in (issue 35).

Its ``status`` is ``ok`` only while generation routes serve the resident model;
otherwise it names the state (``loading``, ``unloading``, ``measuring``,
``degraded``, ``shutting_down``, ``failed``, ``no_model``) with a ``reason``. Each
state is reached for real on an in-process app on the echo engine, held there by
the fault-injection plugin (a generation held at its 2nd token, a slow load, a
hung generation), and ``/api/health`` is read in it.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from millm_host.testing import assert_error, chat_body

BLOCK_S = 120  # a FAULT request holds the engine thread this long unless cancelled


def wait_for(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def health(app) -> dict:
    with app.http() as http:
        return http.get("/api/health").json()


def in_thread(fn) -> threading.Thread:
    thread = threading.Thread(target=fn)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def app(app_factory):
    """Two echo models; a FAULT generation is held at its 2nd token; echo-b's loads take 1 s longer."""
    return app_factory(
        plugins=["fault_injection"],
        models={"echo": {}, "echo-b": {}},
        env={
            "FAULT_INJECTION": f"slow:2:{BLOCK_S}",
            "FAULT_INJECTION_LOAD_DELAY_S": "1",
            "FAULT_INJECTION_LOAD_DELAY_MODELS": "echo-b",  # the start model loads at once
            "GRACEFUL_UNLOAD_TIMEOUT": "60",
        },
    )


def test_ok_says_no_reason(app):
    state = health(app)
    assert (state["status"], state["phase"], state["reason"]) == ("ok", "loaded", None)


def test_measuring_while_admin_work_runs_on_the_model(app):
    registry = app.host.registry
    with registry.activity("measuring", "probe capacity of layers 1-2"):
        state = health(app)
        assert (state["status"], state["phase"], state["model"]) == ("measuring", "loaded", "echo")
        assert state["reason"] == "probe capacity of layers 1-2"
        with app.http() as http:  # work that does not refuse: generation goes on
            assert http.post("/v1/chat/completions", json=chat_body("echo", max_tokens=2)).status_code == 200
    with registry.activity("measuring", "probe capacity of layer 1", refuses=True):
        state = health(app)
        assert state["status"] == "measuring" and "503 model_busy" in state["reason"]
        with app.http() as http:
            refused = http.post("/v1/chat/completions", json=chat_body("echo", max_tokens=2))
        assert "probe capacity of layer 1" in assert_error(refused, 503, "model_busy")["message"]
    assert health(app)["status"] == "ok"
    with pytest.raises(ValueError):
        with registry.activity("dancing", "not a kind health knows"):
            pass


def test_unloading_then_no_model_then_loading(app):
    """The issue's case: an unload waiting for a running request answered ``ok, loaded`` while every
    generation route refused with 503 model_busy."""
    held = httpx.Client(timeout=60)
    body = chat_body("echo", content="FAULT", max_tokens=50, stream=True)
    stream = held.stream("POST", f"{app.v1}/chat/completions", json=body)
    response = stream.__enter__()
    assert response.status_code == 200
    wait_for(lambda: health(app)["queue"]["generating"], "the held generation")
    unloaded: dict = {}
    unloading = in_thread(lambda: unloaded.update(r=httpx.post(f"{app.base_url}/api/models/echo/unload", timeout=60)))
    try:
        wait_for(lambda: health(app)["status"] != "ok", "the unload to begin")
        state = health(app)
        assert (state["status"], state["phase"], state["model"]) == ("unloading", "unloading", "echo")
        assert "1 requests still running" in state["reason"] and "503 model_busy" in state["reason"]
        with app.http() as http:  # what the status says: generation routes refuse
            assert_error(http.post("/v1/chat/completions", json=chat_body("echo", max_tokens=2)), 503, "model_busy")
    finally:
        stream.__exit__(None, None, None)  # the held request ends: the unload goes on
        held.close()
    unloading.join(60)
    assert unloaded["r"].status_code == 200, unloaded["r"].text
    state = health(app)
    assert (state["status"], state["model"], state["phase"], state["reason"]) == (
        "no_model",
        None,
        None,
        "no model is loaded",
    )

    loaded: dict = {}
    loading = in_thread(lambda: loaded.update(r=httpx.post(f"{app.base_url}/api/models/echo-b/load", timeout=60)))
    wait_for(lambda: health(app)["status"] == "loading", "the load to begin")
    state = health(app)
    assert (state["phase"], state["model"]) == ("loading", "echo-b")
    assert "loading" in state["reason"]
    loading.join(60)
    assert loaded["r"].status_code == 200, loaded["r"].text
    assert health(app)["status"] == "ok" and health(app)["model"] == "echo-b"


def test_degraded_while_a_generation_is_stalled(app_factory):
    app = app_factory(
        plugins=["fault_injection"], env={"FAULT_INJECTION": "stall:2:1", "MILLM_GENERATION_STALL_S": "0.3"}
    )
    hung = in_thread(
        lambda: httpx.post(f"{app.v1}/chat/completions", json=chat_body("echo", content="FAULT"), timeout=30)
    )
    wait_for(lambda: health(app)["status"] == "degraded", "the generation to stall")
    state = health(app)
    assert state["phase"] == "loaded" and state["queue"]["stalled"]
    assert "made no progress" in state["reason"] and "503 generation_stalled" in state["reason"]
    hung.join(30)
    wait_for(lambda: health(app)["status"] == "ok", "the hung generation to end")


def test_failed_then_shutting_down(app_factory):
    app = app_factory(models={"broken": {"load_error": "injected: no weights"}}, model="broken", wait_for="failed")
    state = health(app)
    assert (state["status"], state["phase"], state["model"]) == ("failed", "failed", "broken")
    assert "injected: no weights" in state["error"] and "injected: no weights" in state["reason"]
    app.host.begin_shutdown()  # as SIGTERM does
    state = health(app)
    assert state["status"] == "shutting_down" and "503" in state["reason"]
