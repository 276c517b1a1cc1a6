"""LangChain's ``OpenAIEmbeddings`` with its defaults, against real servers.

With ``check_embedding_ctx_length=True`` (the default) LangChain splits each text with the real
tiktoken (``cl100k_base``, loaded offline by ``offline_tiktoken``) and sends token-id arrays.
A default server (``MILLM_EMBEDDING_TOKEN_IDS=cl100k_base``) reads them as OpenAI's ids and
embeds the texts they stand for; a server started with ``model`` reads them as the model's own
ids (README: embeddings), so LangChain must then send strings (``check_embedding_ctx_length=False``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_openai")

TEXTS = ["The quick brown fox", "héllo 日本 — ok"]


@pytest.fixture(scope="module")
def model_ids_server(server_factory, tiny_model_dir):
    """Token ids read as the model's own, as vLLM and llama.cpp's server read them."""
    return server_factory(tiny_model_dir, env={"MILLM_EMBEDDING_TOKEN_IDS": "model"})


def langchain(server, **options):
    from langchain_openai import OpenAIEmbeddings

    return OpenAIEmbeddings(model=server.model_id, base_url=server.v1, api_key="unused", **options)


def text_vectors(server, texts):
    reply = server.openai().embeddings.create(model=server.model_id, input=texts)
    return [item.embedding for item in reply.data]


def test_defaults_get_the_texts_vectors_from_a_default_server(tiny_server, offline_tiktoken):
    embeddings = langchain(tiny_server)  # defaults: tiktoken ids on the wire, read as cl100k_base by default
    assert embeddings.check_embedding_ctx_length and embeddings.tiktoken_enabled
    vectors = embeddings.embed_documents(TEXTS)
    query = embeddings.embed_query(TEXTS[0])
    for vector, expected in zip(vectors, text_vectors(tiny_server, TEXTS), strict=True):
        assert vector == pytest.approx(expected, abs=1e-5)
    assert query == pytest.approx(vectors[0], abs=1e-6)


def test_defaults_against_a_model_ids_server_embed_the_models_tokens_of_those_ids(model_ids_server, offline_tiktoken):
    """The ids are read as the model's: served when they fit its vocabulary (but other tokens), else 400."""
    import openai

    ids = offline_tiktoken.get_encoding("cl100k_base").encode_ordinary(TEXTS[0])
    assert max(ids) < 49152  # SmolLM2's vocabulary: served, as the model's tokens
    [vector] = langchain(model_ids_server).embed_documents(TEXTS[:1])
    [as_model_ids] = text_vectors(model_ids_server, [ids])
    [of_the_text] = text_vectors(model_ids_server, TEXTS[:1])
    assert vector == pytest.approx(as_model_ids, abs=1e-5)
    assert vector != pytest.approx(of_the_text, abs=1e-3)

    with pytest.raises(openai.BadRequestError) as refused:  # an id past SmolLM2's 49,152
        langchain(model_ids_server).embed_documents(TEXTS[1:])
    assert "MILLM_EMBEDDING_TOKEN_IDS=cl100k_base" in str(refused.value)


def test_without_the_length_check_a_model_ids_server_gets_strings(model_ids_server):
    vectors = langchain(model_ids_server, check_embedding_ctx_length=False).embed_documents(TEXTS)
    for vector, expected in zip(vectors, text_vectors(model_ids_server, TEXTS), strict=True):
        assert vector == pytest.approx(expected, abs=1e-5)
