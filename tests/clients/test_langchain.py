"""LangChain's ``ChatOpenAI`` and ``OpenAIEmbeddings`` (langchain-openai), pointed at millm."""

from __future__ import annotations

import pytest
from langchain_openai import ChatOpenAI, OpenAIEmbeddings


@pytest.fixture(scope="module")
def chat(server, model):
    """A ChatOpenAI as a user would configure it for a local server."""

    def make(**kwargs) -> ChatOpenAI:
        kwargs.setdefault("max_tokens", 60)
        return ChatOpenAI(model=model, base_url=server.v1, api_key="not-needed", max_retries=0, **kwargs)

    return make


def test_invoke(chat, scripted):
    reply = chat(default_headers=scripted("Hello there")).invoke("hi")
    assert reply.content == "Hello there"
    assert reply.usage_metadata["output_tokens"] > 0


def test_stream_with_usage(chat, scripted):
    chunks = list(chat(default_headers=scripted("Hello there"), stream_usage=True).stream("hi"))
    assert "".join(chunk.content for chunk in chunks) == "Hello there"
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    assert total.usage_metadata is not None and total.usage_metadata["output_tokens"] > 0
    assert total.response_metadata.get("finish_reason") == "stop"


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output(chat, shapes, method):
    weather = chat().with_structured_output(shapes.Weather, method=method).invoke(shapes.QUESTION)
    assert isinstance(weather, shapes.Weather)


def test_with_structured_output_json_mode(chat, shapes, scripted):
    """json_mode constrains to any JSON object: the scripted reply is one the schema accepts."""
    structured = chat(default_headers=scripted('{"city": "Rome", "sunny": true}')).with_structured_output(
        shapes.Weather, method="json_mode"
    )
    assert structured.invoke("Reply in JSON: the weather in Rome.") == shapes.Weather(city="Rome", sunny=True)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_streams(chat, shapes, method):
    parts = list(chat().with_structured_output(shapes.Weather, method=method).stream(shapes.QUESTION))
    assert parts and isinstance(parts[-1], shapes.Weather)


def test_bind_tools(chat, shapes):
    reply = chat().bind_tools([shapes.GetWeather], tool_choice="GetWeather").invoke(shapes.QUESTION)
    (call,) = reply.tool_calls
    assert call["name"] == "GetWeather" and call["args"]["city"] in ("Paris", "Rome") and call["id"]


def test_bind_tools_streamed(chat, shapes):
    chunks = list(
        chat().bind_tools([shapes.GetWeather], tool_choice="any", parallel_tool_calls=False).stream(shapes.QUESTION)
    )
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    assert total.tool_calls and total.tool_calls[0]["name"] == "GetWeather"


def test_openai_embeddings_with_defaults(server, model):
    """Defaults tokenize with tiktoken (cl100k_base) and send token-id arrays (issue 12 §4)."""
    embeddings = OpenAIEmbeddings(model=model, base_url=server.v1, api_key="not-needed", max_retries=0)
    first, second = embeddings.embed_documents(["hello world", "goodbye"])
    assert len(first) == len(second) > 0 and first != second
    assert len(embeddings.embed_query("hello world")) == len(first)


def test_openai_embeddings_sending_text(server, model):
    """``check_embedding_ctx_length=False`` sends the text, which the server tokenizes with the model's own tokenizer."""
    embeddings = OpenAIEmbeddings(
        model=model, base_url=server.v1, api_key="not-needed", max_retries=0, check_embedding_ctx_length=False
    )
    direct = server.openai().embeddings.create(model=model, input="hello world").data[0].embedding
    assert embeddings.embed_query("hello world") == pytest.approx(direct, rel=1e-5, abs=1e-6)
