"""/v1/embeddings: vectors against a direct forward's pooled last hidden state, and every refusal.

Vectors come from real models in real servers; encoding, normalisation and refusals
are the host's, tested in-process on the echo engine (``echo_app``).
"""

from __future__ import annotations

import base64
import math
import struct

import pytest
import torch

from millm_host.testing import assert_error
from millm_host.testing.openai_schema import validate_openai

from .conftest import NAN_TOKEN

TEXTS = ["The quick brown fox", "jumps over the lazy dog.", "Hello"]


def embed(server, model=None, **body):
    with server.http() as client:
        return client.post("/v1/embeddings", json={"model": model or server.model_id, **body})


def pooled(reference, text: str, pooling: str) -> torch.Tensor:
    hidden = reference.last_hidden(reference.ids(text))
    return {"mean": hidden.mean(0), "last": hidden[-1], "cls": hidden[0]}[pooling]


def test_the_openai_sdk_gets_the_mean_pooled_last_hidden_state(tiny_server, reference):
    reply = tiny_server.openai().embeddings.create(model=tiny_server.model_id, input=TEXTS)  # base64 on the wire
    assert [d.index for d in reply.data] == [0, 1, 2]
    for item, text in zip(reply.data, TEXTS, strict=True):
        assert item.embedding == pytest.approx(pooled(reference, text, "mean").tolist(), abs=1e-5)
    tokens = sum(len(reference.ids(t)) for t in TEXTS)
    assert (reply.usage.prompt_tokens, reply.usage.total_tokens) == (tokens, tokens)


@pytest.mark.parametrize("pooling", ["mean", "last", "cls"])
def test_pooling(tiny_server, reference, pooling):
    body = embed(tiny_server, input=TEXTS[:2], pooling=pooling).json()
    validate_openai("CreateEmbeddingResponse", body)
    for item, text in zip(body["data"], TEXTS, strict=False):
        assert item["embedding"] == pytest.approx(pooled(reference, text, pooling).tolist(), abs=1e-5)


def test_base64_decodes_to_the_float_vector_and_normalize(echo_app):
    floats = embed(echo_app, input=TEXTS[0], normalize=True).json()["data"][0]["embedding"]
    packed = embed(echo_app, input=[TEXTS[0]], normalize=True, encoding_format="base64").json()["data"][0]["embedding"]
    raw = base64.b64decode(packed)
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert decoded == pytest.approx(floats, abs=1e-6)
    assert math.sqrt(math.fsum(v * v for v in floats)) == pytest.approx(1.0, abs=1e-5)
    plain = embed(echo_app, input=TEXTS[0]).json()["data"][0]["embedding"]
    norm = math.sqrt(math.fsum(v * v for v in plain))
    assert [v / norm for v in plain] == pytest.approx(floats, abs=1e-6)


def test_defaults_are_mean_unnormalised(echo_app):
    default = embed(echo_app, input=TEXTS[1]).json()["data"][0]["embedding"]
    explicit = embed(echo_app, input=TEXTS[1], pooling="mean", normalize=False, encoding_format="float").json()["data"][
        0
    ]["embedding"]
    assert default == explicit


def test_over_limit_inputs_are_named_never_truncated(echo_app):
    long = "word " * 600  # the echo model's window is 512 tokens, one a byte
    reply = embed(echo_app, input=["short", long, "short", long])
    error = assert_error(reply, 400, "context_length_exceeded", "input[1]")
    # refused from their length, before they are tokenized (the echo engine's floor: a token a character)
    assert (
        "input[1] (at least 3000 tokens)" in error["message"] and "input[3] (at least 3000 tokens)" in error["message"]
    )
    assert "512" in error["message"]
    many = embed(echo_app, input=[long] * 20)
    message = many.json()["error"]["message"]
    assert "input[15]" in message and "input[16]" not in message and "and 4 more" in message
    single = embed(echo_app, input=long)
    assert_error(single, 400, "context_length_exceeded", "input")


@pytest.fixture(scope="module")
def two_echo_models(app_factory):
    return app_factory(models={"echo": {}, "echo-other": {}})


@pytest.mark.parametrize(
    ("fields", "code", "param", "words"),
    [
        ({"input": ""}, "invalid_parameter", "input", "empty"),
        ({"input": []}, "invalid_parameter", "input", "empty"),
        ({"input": ["a", "b", ""]}, "invalid_parameter", "input", "input[2]"),
        ({"input": ["a"] * 257}, "invalid_parameter", "input", "256"),
        ({"input": [1, "a"]}, "invalid_parameter", "input", "input"),
        ({"input": [[1], "a"]}, "invalid_parameter", "input", "input"),
        ({"input": [3, -1]}, "invalid_parameter", "input", "input"),
        ({"input": [[1], []]}, "invalid_parameter", "input", "input[1]"),
        ({"input": [[1]] * 257}, "invalid_parameter", "input", "256"),
        ({"input": "a", "pooling": "max"}, "invalid_parameter", "pooling", "pooling"),
        ({"input": "a", "encoding_format": "hex"}, "invalid_parameter", "encoding_format", "encoding_format"),
        ({"input": "a", "dimensions": 8}, "field_not_honoured", "dimensions", "dimensions"),
        (
            {"input": "a", "scoring_precision": "float32"},
            "field_not_honoured",
            "scoring_precision",
            "scoring_precision",
        ),
    ],
)
def test_refused_before_any_load(two_echo_models, fields, code, param, words):
    """The named model is not resident; a refusal must not load it (nor evict the resident one)."""
    assert embed(two_echo_models, model="echo", input="warm").status_code == 200
    error = assert_error(embed(two_echo_models, model="echo-other", **fields), 400, code, param)
    assert words in error["message"]
    assert two_echo_models.model_id == "echo"


def test_non_finite_vector_is_a_500_naming_the_input(bf16_server):
    reply = embed(bf16_server, model="broken", input=["fine", f"a{NAN_TOKEN}"])
    error = assert_error(reply, 500, "embedding_vector_invalid", "input[1]")
    assert "input[1]" in error["message"]


def test_zero_norm_under_normalize_is_a_500(bf16_server):
    assert embed(bf16_server, model="zero_norm", input=["a", "b"]).status_code == 200
    reply = embed(bf16_server, model="zero_norm", input=["a", "b"], normalize=True)
    assert_error(reply, 500, "embedding_vector_invalid", "input[0]")


def test_embeddings_carry_no_steering_header_and_report_unused_fields(tiny_server):
    reply = embed(tiny_server, input="a", user="me")  # with every plugin installed (steering included)
    assert reply.status_code == 200
    assert reply.headers["x-millm-ignored-fields"] == '"user"'
    assert "x-millm-steering" not in reply.headers


@pytest.fixture(scope="module")
def model_ids_app(app_factory):
    """Token ids read as the model's own (``MILLM_EMBEDDING_TOKEN_IDS=model``; the default is OpenAI's cl100k)."""
    return app_factory(env={"MILLM_EMBEDDING_TOKEN_IDS": "model"})


def test_token_ids_embed_as_the_text_they_stand_for(model_ids_app):
    """The echo model's token ids are UTF-8 bytes: [72, 105] is "Hi"."""
    echo_app = model_ids_app
    text = embed(echo_app, input=["Hi", "h"]).json()
    nested = embed(echo_app, input=[[72, 105], [104]]).json()
    flat = embed(echo_app, input=[72, 105]).json()
    assert [d["embedding"] for d in nested["data"]] == [d["embedding"] for d in text["data"]]
    assert flat["data"][0]["embedding"] == text["data"][0]["embedding"] and len(flat["data"]) == 1
    assert nested["usage"] == text["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    sdk = echo_app.openai().embeddings.create(model=echo_app.model_id, input=[[72, 105]])  # base64 on the wire
    assert sdk.data[0].embedding == pytest.approx(text["data"][0]["embedding"], abs=1e-6)


@pytest.mark.parametrize(
    ("token_input", "param"),
    [([[1, 2], [3, 257]], "input[1][1]"), ([5, 300], "input[1]"), ([[2**40]], "input[0][0]")],
)
def test_token_ids_outside_the_vocabulary_are_named(model_ids_app, token_input, param):
    error = assert_error(embed(model_ids_app, input=token_input), 400, "invalid_parameter", param)
    assert "vocabulary" in error["message"] and "check_embedding_ctx_length=False" in error["message"]


def test_token_ids_over_the_window_are_refused_never_truncated(echo_app):
    assert_error(embed(echo_app, input=[1] * 513), 400, "context_length_exceeded", "input")
    assert_error(embed(echo_app, input=[[1], [1] * 513]), 400, "context_length_exceeded", "input[1]")
