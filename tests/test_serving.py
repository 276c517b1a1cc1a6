"""One request lifecycle, without HTTP: ``host.serving[endpoint].handle(body, headers, gone=...)``.

What the Batch API (and any other caller that is not a Falcon resource) relies on:
a parsed body goes in, a ``Result`` (a JSON body or a stream of chunks, and the
headers) comes out, scoring-mode bodies are served by the endpoint's scoring, and
a client that is gone (``gone`` returns) cancels the request and frees its place.
"""

from __future__ import annotations

import asyncio

import pytest

from millm_host.app import build
from millm_host.errors import ClientDisconnected
from millm_host.serving.base import Result
from millm_host.settings import Settings


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def host(tmp_path_factory, tiny_model_dir, loop):
    settings = Settings(environ={"MILLM_DATA_DIR": str(tmp_path_factory.mktemp("data")),
                                 "MILLM_MODEL": str(tiny_model_dir), "MILLM_LOAD_ON_START": "false"})
    _, host = build(settings)
    yield host
    host.stop()


@pytest.fixture(scope="module")
def model(host):
    return host.registry.start_model.id


def test_every_endpoint_has_one_serving(host):
    assert set(host.serving) == {"chat.completions", "completions", "embeddings"}
    assert all(serving.endpoint == name for name, serving in host.serving.items())


def test_a_completion_is_a_json_body_and_headers(host, model, loop):
    body = {"model": model, "prompt": "hello", "max_tokens": 3, "temperature": 0}
    result = loop.run_until_complete(host.serving["completions"].handle(body, {}))
    assert isinstance(result, Result) and result.stream is None
    assert result.body["object"] == "text_completion" and len(result.body["choices"]) == 1
    assert result.body["usage"]["completion_tokens"] <= 3
    assert result.headers["X-miLLM-Model"] == model


def test_a_streamed_chat_is_a_stream_of_chunks(host, model, loop):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}

    async def collect() -> tuple[Result, list]:
        result = await host.serving["chat.completions"].handle(body, {})
        assert result.stream is not None
        return result, [item async for item in result.stream if item is not None]

    result, items = loop.run_until_complete(collect())
    assert result.body is None and result.headers["X-miLLM-Model"] == model
    assert items[-1] == "[DONE]" and items[0]["choices"][0]["delta"]["role"] == "assistant"
    assert host.scheduler.admitted == 0


def test_a_scoring_body_is_served_by_the_endpoints_scoring(host, model, loop):
    body = {"model": model, "prompt": "hello", "max_tokens": 1, "logprobs": 2}
    result = loop.run_until_complete(host.serving["completions"].handle(body, {}))
    logprobs = result.body["choices"][0]["logprobs"]
    assert len(logprobs["top_logprobs"][0]) == 2 and logprobs["text_offset"] == [5]


def test_embeddings(host, model, loop):
    body = {"model": model, "input": ["hello", "world"]}
    result = loop.run_until_complete(host.serving["embeddings"].handle(body, {}))
    assert [d["index"] for d in result.body["data"]] == [0, 1]
    assert result.headers["X-miLLM-Model"] == model


@pytest.mark.parametrize(("endpoint", "body"), [
    ("completions", {"prompt": "hello", "max_tokens": 3}),
    ("chat.completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": True}),
    ("embeddings", {"input": "hello"}),
])
def test_a_client_that_is_gone_cancels_the_request_on_every_endpoint(host, model, loop, endpoint, body):
    async def gone() -> None:
        return  # the client has already left

    with pytest.raises(ClientDisconnected):
        loop.run_until_complete(host.serving[endpoint].handle({"model": model, **body}, {}, gone=gone))
    assert host.scheduler.admitted == 0, "the queue place is freed"
