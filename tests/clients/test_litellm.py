"""litellm's OpenAI-compatible provider (``model="openai/<name>"``, ``api_base=...``), pointed at millm."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def litellm():
    import litellm

    litellm.telemetry = False
    litellm.callbacks, litellm.success_callback, litellm.failure_callback = [], [], []
    return litellm


@pytest.fixture(scope="module")
def target(server, model):
    return {"model": f"openai/{model}", "api_base": server.v1, "api_key": "not-needed", "num_retries": 0}


def test_completion(litellm, target, scripted):
    reply = litellm.completion(
        messages=[{"role": "user", "content": "hi"}], max_tokens=8, extra_headers=scripted("Hello there"), **target
    )
    assert reply.choices[0].message.content == "Hello there"
    assert reply.usage.completion_tokens > 0


def test_streaming(litellm, target, scripted):
    chunks = list(
        litellm.completion(
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=scripted("Hello there"),
            **target,
        )
    )
    # with include_usage the last chunk may carry only the usage (empty choices), as OpenAI sends it
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == "Hello there"
    rebuilt = litellm.stream_chunk_builder(chunks)
    assert rebuilt.choices[0].message.content == "Hello there"
    assert rebuilt.usage.completion_tokens > 0


def test_embeddings(litellm, target):
    reply = litellm.embedding(input=["hello world", "goodbye"], **target)
    first, second = (item["embedding"] for item in reply.data)
    assert len(first) == len(second) > 0 and first != second


def test_tools(litellm, target, shapes):
    reply = litellm.completion(
        messages=shapes.QUESTION,
        tools=[shapes.WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "GetWeather"}},
        max_tokens=40,
        **target,
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "GetWeather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")


def test_structured_output(litellm, target, shapes):
    reply = litellm.completion(messages=shapes.QUESTION, response_format=shapes.Weather, max_tokens=60, **target)
    shapes.Weather.model_validate_json(reply.choices[0].message.content)
