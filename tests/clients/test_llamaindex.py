"""LlamaIndex's ``OpenAILike`` (llama-index-llms-openai-like), pointed at millm."""

from __future__ import annotations

import pytest
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike


@pytest.fixture(scope="module")
def llm(server, model, scripted):
    def make(**kwargs) -> OpenAILike:
        return OpenAILike(
            model=model,
            api_base=server.v1,
            api_key="not-needed",
            max_tokens=8,
            max_retries=0,
            default_headers=scripted("Hello there"),
            **kwargs,
        )

    return make


def test_complete_on_the_completions_endpoint(llm):
    assert llm(is_chat_model=False).complete("Say").text == "Hello there"


def test_complete_through_chat(llm):
    assert llm(is_chat_model=True).complete("hi").text == "Hello there"


def test_chat(llm):
    reply = llm(is_chat_model=True).chat([ChatMessage(role="user", content="hi")])
    assert reply.message.content == "Hello there"


def test_stream_chat(llm):
    chunks = list(llm(is_chat_model=True).stream_chat([ChatMessage(role="user", content="hi")]))
    assert "".join(chunk.delta or "" for chunk in chunks) == "Hello there"
    assert chunks[-1].message.content == "Hello there"


def test_stream_complete(llm):
    chunks = list(llm(is_chat_model=False).stream_complete("Say"))
    assert chunks[-1].text == "Hello there"
