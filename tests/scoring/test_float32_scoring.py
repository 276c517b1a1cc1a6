"""scoring_precision: "float32" on a bfloat16-served model, and every reason it can be refused.

Refusals that only need a setting run in-process (the transformers engine in the test's
own process); the rest on a real server.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from millm_host.testing import assert_error

PROMPTS = ["The capital of France is", "Once upon a time there was"]


def health(server) -> dict:
    with server.http() as client:
        return client.get("/api/health").json()


def score(server, model="bf16", **fields):
    with server.http() as client:
        return client.post(
            "/v1/completions",
            json={
                "model": model,
                "prompt": PROMPTS,
                "max_tokens": 1,
                "logprobs": 5,
                "return_tokens_as_token_ids": True,
                **fields,
            },
        )


def logprobs_of(body: dict) -> list[dict[int, float]]:
    return [
        {int(k.removeprefix("token_id:")): v for k, v in c["logprobs"]["top_logprobs"][0].items()}
        for c in body["choices"]
    ]


def test_float32_scoring_matches_a_float32_forward_and_leaves_the_served_weights(bf16_server, bf16_reference):
    native_before = score(bf16_server, scoring_precision="native")
    reply = score(bf16_server, scoring_precision="float32")
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-millm-scoring-precision"] == "float32"
    assert reply.json()["scoring_precision"] == "float32"
    assert "bfloat16" in reply.json()["system_fingerprint"]
    worst_native = 0.0
    for prompt, full, native in zip(PROMPTS, logprobs_of(reply.json()), logprobs_of(native_before.json()), strict=True):
        expected = bf16_reference.logprobs(bf16_reference.ids(prompt))
        assert set(full) == set(torch.topk(expected, 5).indices.tolist())
        for token, value in full.items():
            assert value == pytest.approx(float(expected[token]), abs=1e-5)
        worst_native = max([worst_native, *(abs(native[t] - float(expected[t])) for t in native)])
    assert worst_native > 1e-4, "bfloat16 rounding shows in native scoring (else this test proves nothing)"
    native_after = score(bf16_server)
    assert native_after.json()["choices"] == native_before.json()["choices"], "the served weights are untouched"
    assert "x-millm-scoring-precision" not in native_after.headers


def test_a_second_float32_request_while_one_is_admitted_is_busy(bf16_server, bf16_env):
    """Deterministic: a held generation occupies the engine thread while A, then B, queue."""
    gate = Path(bf16_env["TEST_GATE_FILE"])
    assert score(bf16_server, scoring_precision="native").status_code == 200  # the bf16 model is resident
    results: dict[str, object] = {}

    def send(name, fn):
        thread = threading.Thread(target=lambda: results.__setitem__(name, fn()), daemon=True)
        thread.start()
        return thread

    def wait_for(predicate, what):
        deadline = time.monotonic() + 30
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)

    def held_chat():
        with bf16_server.http() as client:
            return client.post(
                "/v1/chat/completions",
                json={
                    "model": "bf16",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 1,
                    "user": "hold",
                },
            )

    admitted = health(bf16_server)["queue"]["admitted"]
    threads = [send("held", held_chat)]
    wait_for(lambda: Path(str(gate) + ".held").exists(), "the held request")
    threads.append(send("a", lambda: score(bf16_server, scoring_precision="float32")))
    wait_for(lambda: health(bf16_server)["queue"]["admitted"] == admitted + 2, "A in the queue")
    threads.append(send("b", lambda: score(bf16_server, scoring_precision="float32")))
    # Prompts are tokenized beside the engine thread, so B may be refused before it queues.
    wait_for(lambda: "b" in results or health(bf16_server)["queue"]["admitted"] == admitted + 3, "B")
    gate.touch()
    for thread in threads:
        thread.join(60)
    assert results["held"].status_code == 200
    assert results["a"].status_code == 200 and results["a"].json()["scoring_precision"] == "float32"
    busy = results["b"]
    error = assert_error(busy, 409, "scoring_precision_unavailable", "scoring_precision")
    assert "busy" in error["message"]
    assert busy.headers["x-millm-scoring-precision-reason"] == "busy"
    assert score(bf16_server, scoring_precision="float32").status_code == 200, "the place is released"


def refused(reply, reason: str) -> None:
    error = assert_error(reply, 409, "scoring_precision_unavailable", "scoring_precision")
    assert reason in error["message"]
    assert reply.headers["x-millm-scoring-precision-reason"] == reason


def in_process(app_factory, model_dir, env):
    return app_factory(plugins=["engine_transformers"], checkpoint=model_dir, env=env)


def test_a_gpu_copy_of_a_cpu_model_is_refused_with_device(app_factory, bf16_model_dir):
    server = in_process(app_factory, bf16_model_dir, {"MILLM_DTYPE": "bfloat16", "SCORING_FLOAT32_DEVICE": "cuda"})
    model = server.model_id
    refused(score(server, model=model, scoring_precision="float32"), "device")
    assert score(server, model=model).status_code == 200, "native scoring is unaffected"


def test_a_copy_that_does_not_fit_is_refused_with_memory(app_factory, bf16_model_dir):
    server = in_process(
        app_factory, bf16_model_dir, {"MILLM_DTYPE": "bfloat16", "SCORING_FLOAT32_HEADROOM_MB": str(2**40)}
    )
    refused(score(server, model=server.model_id, scoring_precision="float32"), "memory")


def test_a_quantized_model_is_not_float32_castable(bf16_server):
    refused(score(bf16_server, model="bitnet", scoring_precision="float32"), "model_not_float32_castable")
    assert score(bf16_server, model="bitnet").status_code == 200, "native scoring of the quantized model works"
