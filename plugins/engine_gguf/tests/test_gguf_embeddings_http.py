"""``/v1/embeddings`` on a GGUF model, through the server (the endpoint is the host's)."""

from __future__ import annotations

import base64
import struct

import numpy as np
import pytest

from millm_host.testing import assert_error
from millm_host.testing.openai_schema import validate_openai

from .conftest import DEFAULT_ID, SOLO_ID

TEXTS = ["The quick brown fox.", "A second, rather longer sentence about embeddings and pooling."]


def test_mean_pooled_vectors_equal_llama_cpp(gguf_server, reference_embedder):
    with gguf_server.http() as http:
        response = http.post("/v1/embeddings", json={"model": DEFAULT_ID, "input": TEXTS, "encoding_format": "float"})
    assert response.status_code == 200, response.text
    body = response.json()
    validate_openai("CreateEmbeddingResponse", body)
    for text, item in zip(TEXTS, body["data"], strict=True):
        np.testing.assert_allclose(item["embedding"], reference_embedder.embed(text), rtol=1e-4, atol=1e-4)
    assert body["usage"]["prompt_tokens"] > 0


def test_sdk_base64_and_normalize(gguf_server, reference_embedder):
    client = gguf_server.openai()
    plain = client.embeddings.create(model=DEFAULT_ID, input=TEXTS[0])  # the SDK asks for base64
    vector = np.array(plain.data[0].embedding)
    np.testing.assert_allclose(vector, reference_embedder.embed(TEXTS[0]), rtol=1e-4, atol=1e-4)
    with gguf_server.http() as http:
        raw = http.post(
            "/v1/embeddings",
            json={"model": DEFAULT_ID, "input": TEXTS[0], "encoding_format": "base64", "normalize": True},
        ).json()["data"][0]["embedding"]
    decoded = np.array(struct.unpack(f"<{len(base64.b64decode(raw)) // 4}f", base64.b64decode(raw)))
    assert abs(np.linalg.norm(decoded) - 1) < 1e-5
    np.testing.assert_allclose(decoded, vector / np.linalg.norm(vector), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pooling", ["last", "cls"])
def test_pooling_other_than_mean_is_refused_before_any_load(gguf_server, pooling):
    with gguf_server.http() as http:
        response = http.post("/v1/embeddings", json={"model": SOLO_ID, "input": "x", "pooling": pooling})
        health = http.get("/api/health").json()
    assert_error(response, 400, "field_not_honoured", "pooling")
    assert health["model"] == DEFAULT_ID


def test_an_input_past_the_embedding_window_is_refused_naming_it(gguf_server):
    long_text = "word " * 700  # past min(n_ctx, n_batch) = 512 tokens
    with gguf_server.http() as http:
        response = http.post("/v1/embeddings", json={"model": DEFAULT_ID, "input": ["short", long_text]})
    error = assert_error(response, 400, "context_length_exceeded", "input[1]")
    assert "512" in error["message"]


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "max_tokens": 1, "logprobs": 2},
        {"prompt": "x", "max_tokens": 1, "allowed_token_ids": [1, 2]},
        {"prompt": "x", "max_tokens": 1, "logprobs": 2, "scoring_precision": "float32"},
    ],
)
def test_scoring_is_refused_on_gguf_before_any_load(gguf_server, body):
    with gguf_server.http() as http:
        response = http.post("/v1/completions", json={"model": SOLO_ID, **body})
        health = http.get("/api/health").json()
    assert_error(response, 400, "field_not_honoured")
    assert health["model"] == DEFAULT_ID


def test_chat_scoring_is_refused_on_gguf(gguf_server):
    with gguf_server.http() as http:
        response = http.post(
            "/v1/chat/completions",
            json={
                "model": DEFAULT_ID,
                "max_tokens": 1,
                "logprobs": True,
                "top_logprobs": 2,
                "messages": [{"role": "user", "content": "x"}],
            },
        )
    assert response.status_code == 400 and response.json()["error"]["param"] in ("logprobs", "top_logprobs")
