"""MILLM_EMBEDDING_TOKEN_IDS: token-id embedding inputs read as OpenAI's tiktoken ids, in-process on the echo engine.

The echo model's tokens are UTF-8 bytes, so a text's usage is its byte count; the ids sent
come from the real tiktoken, loading its vocabularies offline (``offline_tiktoken``).
"""

from __future__ import annotations

import pytest

from millm_host.app import Host
from millm_host.plugins import build_plugin_manager
from millm_host.settings import Settings
from millm_host.testing import assert_error
from millm_host.tiktoken_vocab import ranks

TEXTS = ["Hi there", "héllo 日本 — ok"]


def embed(server, **body):
    with server.http() as client:
        return client.post("/v1/embeddings", json={"model": server.model_id, **body})


@pytest.fixture(scope="module")
def cl100k_app(app_factory):
    return app_factory(env={"MILLM_EMBEDDING_TOKEN_IDS": "cl100k_base"})


@pytest.mark.parametrize("vocabulary", ["cl100k_base", "o200k_base"])
def test_openai_token_ids_embed_as_the_text_they_stand_for(app_factory, offline_tiktoken, vocabulary):
    app = app_factory(env={"MILLM_EMBEDDING_TOKEN_IDS": vocabulary})
    encoding = offline_tiktoken.get_encoding(vocabulary)
    ids = [encoding.encode_ordinary(t) for t in TEXTS]
    assert max(max(i) for i in ids) > 256  # past the echo model's own vocabulary: read as OpenAI's
    text = embed(app, input=TEXTS).json()
    nested = embed(app, input=ids).json()
    flat = embed(app, input=ids[1]).json()
    assert [d["embedding"] for d in nested["data"]] == [d["embedding"] for d in text["data"]]
    assert flat["data"][0]["embedding"] == text["data"][1]["embedding"] and len(flat["data"]) == 1
    # usage counts the model's tokens (bytes, for the echo model), not the ids sent
    model_tokens = sum(len(t.encode()) for t in TEXTS)
    assert nested["usage"] == text["usage"] == {"prompt_tokens": model_tokens, "total_tokens": model_tokens}
    assert flat["usage"]["prompt_tokens"] == len(TEXTS[1].encode())


@pytest.mark.parametrize(
    ("token_input", "param"),
    [([[791], [791, 100256]], "input[1][1]"), ([791, 100257], "input[1]"), ([[2**40]], "input[0][0]")],
)
def test_ids_past_the_vocabulary_are_named(cl100k_app, token_input, param):
    """100256 is past cl100k_base's ordinary tokens; 100257 is its <|endoftext|>, not embedded either."""
    error = assert_error(embed(cl100k_app, input=token_input), 400, "invalid_parameter", param)
    assert "outside cl100k_base (ids 0-100255" in error["message"]


@pytest.mark.parametrize(("split", "param"), [(True, "input[1]"), (False, "input")])
def test_ids_that_are_not_utf8_are_named(cl100k_app, split, param):
    """A lone lead byte (half of "é") is no text; the server keeps serving."""
    lead = ranks("cl100k_base").index(b"\xc3")
    token_input = [[791], [791, lead]] if split else [lead]
    error = assert_error(embed(cl100k_app, input=token_input), 400, "invalid_parameter", param)
    assert "not UTF-8" in error["message"]
    assert embed(cl100k_app, input=[[791]]).status_code == 200


def test_text_inputs_are_unchanged(cl100k_app, echo_app):
    assert embed(cl100k_app, input=TEXTS).json()["data"] == embed(echo_app, input=TEXTS).json()["data"]


def test_the_setting_is_declared_and_checked_at_start(tmp_path):
    settings = Settings(environ={"MILLM_DATA_DIR": str(tmp_path), "MILLM_EMBEDDING_TOKEN_IDS": "p50k_base"})
    pm = build_plugin_manager(settings)
    assert "MILLM_EMBEDDING_TOKEN_IDS" in {s.name for s in settings.declared}
    with pytest.raises(ValueError, match="MILLM_EMBEDDING_TOKEN_IDS='p50k_base' is not one of model, cl100k_base"):
        Host(settings, pm)
