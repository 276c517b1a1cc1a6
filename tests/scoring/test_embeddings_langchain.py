"""LangChain's ``OpenAIEmbeddings`` with its defaults, against a real server.

With ``check_embedding_ctx_length=True`` (the default) LangChain splits each text with tiktoken
and sends token-id arrays. tiktoken fetches ``cl100k_base`` from the network on first use, which
cannot happen here, so this test stands in a byte-level encoding under that name (ids 0-255):
what is exercised is the request LangChain sends and the server's answer to it. The ids are taken
as the model's own (README: the tiktoken caveat), so the vector is compared with the server's
embedding of the same ids, not of the text.
"""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_openai")
tiktoken = pytest.importorskip("tiktoken")


@pytest.fixture
def byte_level_cl100k(monkeypatch):
    encoding = tiktoken.Encoding(
        name="cl100k_base",
        pat_str=r"""\S+|\s+""",
        mergeable_ranks={bytes([b]): b for b in range(256)},
        special_tokens={},
    )
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: encoding)
    monkeypatch.setattr(tiktoken, "encoding_for_model", lambda name: encoding)
    return encoding


def test_openai_embeddings_with_defaults(tiny_server, byte_level_cl100k):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(model=tiny_server.model_id, base_url=tiny_server.v1, api_key="unused")
    texts = ["The quick brown fox", "Hello"]
    vectors = embeddings.embed_documents(texts)
    query = embeddings.embed_query("Hello")
    ids = [byte_level_cl100k.encode_ordinary(t) for t in texts]
    direct = tiny_server.openai().embeddings.create(model=tiny_server.model_id, input=ids)
    for vector, item in zip(vectors, direct.data, strict=True):
        assert vector == pytest.approx(item.embedding, abs=1e-5)
    assert query == pytest.approx(vectors[1], abs=1e-6)
