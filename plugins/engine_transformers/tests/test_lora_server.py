"""LoRA adapters through the app's HTTP API, in-process: ``MILLM_LORA_DIRS``, ``"<base>:<adapter>"``, the routes.

The adapters are built with ``peft`` on the tiny random Llama (``test_lora.make_adapter``);
answers are checked against ``PeftModel``'s own forward, base answers against the plain model.
"""

from __future__ import annotations

import json
import os
import threading

import httpx
import pytest

from millm_host.testing import assert_error

from .test_lora import PROMPTS, greedy, make_adapter, reference_models


@pytest.fixture(scope="module")
def lora_roots(tmp_path_factory, tiny_model_dir):
    served, spare = tmp_path_factory.mktemp("lora-served"), tmp_path_factory.mktemp("lora-spare")
    make_adapter(tiny_model_dir, served / "alpha", seed=1)
    return served, spare


@pytest.fixture(scope="module")
def server(tiny_app, lora_roots):
    return tiny_app(plugins=("webui",), MILLM_LORA_DIRS=os.pathsep.join(str(r) for r in lora_roots))


@pytest.fixture(scope="module")
def reference(tiny_model_dir, lora_roots):
    return reference_models(tiny_model_dir, {"alpha": lora_roots[0] / "alpha"})


def complete(server, model: str, ids: list[int], steps: int = 5) -> httpx.Response:
    body = {"model": model, "prompt": ids, "max_tokens": steps, "temperature": 0, "logprobs": 0}
    with server.http() as http:
        return http.post("/v1/completions", json=body, timeout=60)


def logprobs(response: httpx.Response) -> list[float]:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]["token_logprobs"]


def test_models_lists_each_adapter_after_its_base(server, lora_roots):
    base = server.model_id
    with server.http() as http:
        listed = http.get("/v1/models").json()["data"]
        one = http.get(f"/v1/models/{base}:alpha").json()
    adapter = {"id": f"{base}:alpha", "object": "model", "parent": base, "root": str(lora_roots[0] / "alpha")}
    assert [m["id"] for m in listed][:2] == [base, f"{base}:alpha"]
    assert listed[1].items() >= adapter.items() and one.items() >= adapter.items()
    assert "parent" not in listed[0]
    with server.http() as http:  # the web UI's Models page lists it under its base, with a Remove button
        page = http.get("/ui/models").text
    assert f"<code>{base}:alpha</code>" in page and f"/api/models/{base}/adapters/alpha" in page


@pytest.mark.parametrize("name", ["{base}:alpha", "alpha", "{base}"])
def test_answers_equal_peft_forward(server, reference, name):
    model = name.format(base=server.model_id)
    adapter = None if model == server.model_id else "alpha"
    for ids in PROMPTS[:2]:
        assert logprobs(complete(server, model, ids)) == pytest.approx(greedy(reference[adapter], ids, 5)[1], abs=1e-4)


def test_adapted_and_base_requests_together_each_get_their_own(server):
    base = server.model_id
    jobs = [(model, ids) for ids in PROMPTS for model in (base, f"{base}:alpha")]
    alone = [logprobs(complete(server, model, ids, 8)) for model, ids in jobs]
    results: list = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def work(index, model, ids):
        barrier.wait()
        results[index] = logprobs(complete(server, model, ids, 8))

    threads = [threading.Thread(target=work, args=(i, *job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for got, want in zip(results, alone, strict=True):
        assert got == pytest.approx(want, abs=1e-4)


def test_an_unknown_adapter_is_model_not_found(server):
    for model in (f"{server.model_id}:nope", "nope"):
        assert_error(complete(server, model, PROMPTS[0]), 404, "model_not_found", "model")
    with server.http() as http:
        assert_error(http.get(f"/v1/models/{server.model_id}:nope"), 404, "model_not_found")


def test_load_and_unload_without_a_restart(server, lora_roots, tiny_model_dir, tmp_path):
    base, (served, spare) = server.model_id, lora_roots
    beta = make_adapter(tiny_model_dir, spare / "beta", seed=2, targets=["k_proj", "up_proj"])
    before = logprobs(complete(server, base, PROMPTS[0]))
    with server.http() as http:
        added = http.post(f"/api/models/{base}/adapters", json={"name": "beta", "path": str(beta)})
        assert added.status_code == 200, added.text
        assert added.json() == {"id": f"{base}:beta", "name": "beta", "base": base, "path": str(beta)}
        assert [a["name"] for a in http.get(f"/api/models/{base}/adapters").json()["data"]] == ["alpha", "beta"]
        assert f"{base}:beta" in [m["id"] for m in http.get("/v1/models").json()["data"]]
        adapted = logprobs(complete(server, f"{base}:beta", PROMPTS[0]))
        assert adapted != pytest.approx(before, abs=1e-4)
        assert_error(
            http.post(f"/api/models/{base}/adapters", json={"name": "beta", "path": str(served / "alpha")}),
            409,
            "adapter_exists",
        )
        outside = make_adapter(tiny_model_dir, tmp_path / "gamma", seed=3)
        assert_error(
            http.post(f"/api/models/{base}/adapters", json={"name": "gamma", "path": str(outside)}),
            400,
            "invalid_parameter",
            "path",
        )
        assert_error(
            http.post(f"/api/models/{base}/adapters", json={"name": "empty", "path": str(spare)}),
            400,
            "invalid_parameter",
            "path",
        )
        deleted = http.delete(f"/api/models/{base}/adapters/beta")
        assert deleted.status_code == 200, deleted.text
        assert_error(http.delete(f"/api/models/{base}/adapters/beta"), 404, "model_not_found")
    assert_error(complete(server, f"{base}:beta", PROMPTS[0]), 404, "model_not_found", "model")
    assert logprobs(complete(server, base, PROMPTS[0])) == pytest.approx(before, abs=1e-5)


def test_an_adapter_the_model_cannot_take_is_refused_and_not_served(server, lora_roots, tiny_model_dir):
    broken = make_adapter(tiny_model_dir, lora_roots[1] / "broken", seed=4)
    config = json.loads((broken / "adapter_config.json").read_text())
    (broken / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["no_such_proj"]}))
    base = server.model_id
    with server.http() as http:
        refused = http.post(f"/api/models/{base}/adapters", json={"name": "broken", "path": "broken"})
        error = assert_error(refused, 400, "invalid_parameter", "path")
        assert "cannot be served on this model" in error["message"]
        assert "broken" not in [a["name"] for a in http.get(f"/api/models/{base}/adapters").json()["data"]]


def test_the_prefix_cache_keeps_adapters_apart(server, reference):
    base, ids = server.model_id, list(range(30, 52))

    def cached(response: httpx.Response) -> int:
        assert response.status_code == 200, response.text
        return response.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)

    first, again = complete(server, f"{base}:alpha", ids), complete(server, f"{base}:alpha", ids)
    assert cached(first) == 0 and cached(again) > 0  # the same adapter reuses its prompt
    plain = complete(server, base, ids)
    assert cached(plain) == 0  # the base model never reuses what the adapter computed
    assert logprobs(plain) == pytest.approx(greedy(reference[None], ids, 5)[1], abs=1e-4)
    assert logprobs(again) == pytest.approx(greedy(reference["alpha"], ids, 5)[1], abs=1e-4)


def test_chat_embeddings_and_prompt_scores_serve_the_adapter(server):
    base = server.model_id
    with server.http() as http:

        def post(path: str, model: str, **body) -> dict:
            response = http.post(path, json={"model": model, **body}, timeout=60)
            assert response.status_code == 200, response.text
            return response.json()

        hello = [{"role": "user", "content": "hi"}]
        chats = [
            post("/v1/chat/completions", m, messages=hello, max_tokens=3, temperature=0, logprobs=True)
            for m in (base, f"{base}:alpha")
        ]
        vectors = [post("/v1/embeddings", m, input="the sea")["data"][0]["embedding"] for m in (base, f"{base}:alpha")]
        echoed = [
            post("/v1/completions", m, prompt=PROMPTS[2], max_tokens=0, echo=True, logprobs=0)["choices"][0]["logprobs"]
            for m in (base, f"{base}:alpha")
        ]
    lp = [[t["logprob"] for t in c["choices"][0]["logprobs"]["content"]] for c in chats]
    assert lp[0] != pytest.approx(lp[1], abs=1e-4)
    assert vectors[0] != pytest.approx(vectors[1], abs=1e-4)
    assert echoed[0]["token_logprobs"][1:] != pytest.approx(echoed[1]["token_logprobs"][1:], abs=1e-4)


def test_a_response_names_the_adapter_it_served(server):
    adapted = f"{server.model_id}:alpha"
    for model in (adapted, "alpha"):
        reply = server.openai().chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0
        )
        assert reply.model == adapted
    plain = server.openai().completions.create(model=server.model_id, prompt="hi", max_tokens=2)
    assert plain.model == server.model_id
