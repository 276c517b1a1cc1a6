"""GGUF model names: ``repo:QUANT``, several quantizations side by side, bare names refused."""

from __future__ import annotations

import openai
import pytest

from millm_engine_gguf.spec import describe
from millm_host.testing import assert_error

from .conftest import DEFAULT_ID, SECOND_QUANT_ID, SOLO_ID


def test_describe_names_by_repository_and_quantization(tmp_path, gguf_path):
    tagged = tmp_path / "Llama-3.2-1B-Instruct-IQ3_XS.gguf"
    untagged = tmp_path / "model.gguf"
    for link in (tagged, untagged):
        link.symlink_to(gguf_path)
    (tmp_path / "fake.gguf").write_text("not a GGUF file")
    d = describe(str(tagged))
    assert (d.id, d.repo, d.quantization, d.engine, d.format) == (
        "Llama-3.2-1B-Instruct:IQ3_XS",
        "Llama-3.2-1B-Instruct",
        "IQ3_XS",
        "gguf",
        "gguf",
    )
    assert (describe(str(untagged)).id, describe(str(untagged)).repo) == ("model", None)
    assert describe(str(tmp_path / "fake.gguf")) is None
    assert describe(str(tmp_path)) is None


def test_serve_engine_gguf_serves_the_default_model(gguf_server):
    health = gguf_server.http().get("/api/health").json()
    assert (health["status"], health["model"], health["engine"]) == ("ok", DEFAULT_ID, "gguf")
    detail = gguf_server.http().get(f"/api/models/{DEFAULT_ID}").json()
    assert (detail["engine"], detail["quantization"], detail["context_window"]) == ("gguf", "Q4_1", 512)
    assert detail["hf_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_v1_models_lists_every_quantization(gguf_server):
    client = gguf_server.openai()
    assert {m.id for m in client.models.list()} == {DEFAULT_ID, SECOND_QUANT_ID, SOLO_ID}
    assert client.models.retrieve(SECOND_QUANT_ID).id == SECOND_QUANT_ID


def states(server) -> dict[str, str]:
    return {m["id"]: m["state"] for m in server.http().get("/api/models").json()["data"]}


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bare_repository_name_with_one_quantization_is_404_naming_the_model(gguf_server, endpoint):
    client = gguf_server.openai()
    with pytest.raises(openai.NotFoundError) as caught:
        if endpoint == "chat":
            client.chat.completions.create(model="Solo-Model", messages=[{"role": "user", "content": "hi"}])
        else:
            client.completions.create(model="Solo-Model", prompt="hi")
    error = caught.value.body
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert SOLO_ID in error["message"]
    assert states(gguf_server)[SOLO_ID] == "READY"  # nothing was loaded


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bare_repository_name_with_several_quantizations_is_ambiguous(gguf_server, endpoint):
    response = gguf_server.http().post(
        "/v1/chat/completions" if endpoint == "chat" else "/v1/completions",
        json={"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"},
    )
    error = assert_error(response, 400, "AMBIGUOUS_MODEL_NAME", "model")
    assert DEFAULT_ID in error["message"] and SECOND_QUANT_ID in error["message"]
    assert states(gguf_server)[SECOND_QUANT_ID] == "READY"


def test_another_quantization_loads_on_request(gguf_server):
    client = gguf_server.openai()
    try:
        reply = client.chat.completions.create(
            model=SECOND_QUANT_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.model == SECOND_QUANT_ID
        assert states(gguf_server)[SECOND_QUANT_ID] == "LOADED"
        assert states(gguf_server)[DEFAULT_ID] == "READY"
    finally:
        client.chat.completions.create(model=DEFAULT_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert states(gguf_server)[DEFAULT_ID] == "LOADED"
