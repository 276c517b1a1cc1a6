"""One request lifecycle, without HTTP: ``host.serving[endpoint].handle(body, headers, gone=...)``.

What the Batch API (and any other caller that is not a Falcon resource) relies on:
a parsed body goes in, a ``Result`` (a JSON body or a stream of chunks, and the
headers) comes out, scoring-mode bodies are served by the endpoint's scoring, and
a client that is gone (``gone`` returns) cancels the request and frees its place.
Runs in-process on the echo engine.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from millm_host.errors import ClientDisconnected
from millm_host.serving.base import Result
from millm_host.testing.hops import count_dispatches


def handle(app, endpoint: str, body: dict[str, Any], **kwargs: Any) -> Result:
    return app.call(app.host.serving[endpoint].handle({"model": app.model_id, **body}, {}, **kwargs))


def test_every_endpoint_has_one_serving(echo_app):
    assert set(echo_app.host.serving) == {
        "chat.completions",
        "completions",
        "embeddings",
        "tokenize",
        "detokenize",
        "responses",
        "messages",
        "messages.count_tokens",
    }
    # /v1/responses and /v1/messages are served as chat completions (their context's endpoint), under routes
    # of their own
    assert all(getattr(serving, "route", serving.endpoint) == name for name, serving in echo_app.host.serving.items())


def test_a_completion_is_a_json_body_and_headers(echo_app):
    result = handle(echo_app, "completions", {"prompt": "hello", "max_tokens": 3})
    assert isinstance(result, Result) and result.stream is None
    assert result.body["object"] == "text_completion" and result.body["choices"][0]["text"] == "hel"
    assert result.headers["X-miLLM-Model"] == echo_app.model_id


def test_a_streamed_chat_is_a_stream_of_chunks(echo_app):
    body = {
        "model": echo_app.model_id,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
    }

    async def collect() -> tuple[Result, list]:  # on the app's loop: no blocking call to it from here
        result = await echo_app.host.serving["chat.completions"].handle(body, {})
        assert result.stream is not None
        return result, [item async for item in result.stream if item is not None]

    result, items = echo_app.call(collect())
    assert result.body is None and result.headers["X-miLLM-Model"] == echo_app.model_id
    assert items[0]["choices"][0]["delta"]["role"] == "assistant" and items[-1] == "[DONE]"
    assert echo_app.host.scheduler.admitted == 0


def test_a_scoring_body_is_served_by_the_endpoints_scoring(echo_app, monkeypatch):
    served = []

    async def scoring(body, headers, *, gone=None):  # the echo engine does not score: record the hand-over
        served.append(body)
        return Result(headers={}, body={})

    monkeypatch.setattr(echo_app.host.serving["completions"].scoring, "handle", scoring)
    handle(echo_app, "completions", {"prompt": "hello", "max_tokens": 1, "logprobs": 2})
    handle(echo_app, "completions", {"prompt": "hello", "max_tokens": 1, "logprobs": None})
    assert [body["logprobs"] for body in served] == [2]


def test_embeddings(echo_app):
    result = handle(echo_app, "embeddings", {"input": ["hello", "world"]})
    assert [d["index"] for d in result.body["data"]] == [0, 1]
    assert result.headers["X-miLLM-Model"] == echo_app.model_id


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("completions", {"prompt": "hello", "max_tokens": 3}),
        ("chat.completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
        ("embeddings", {"input": "hello"}),
    ],
)
def test_a_client_that_is_gone_cancels_the_request_on_every_endpoint(echo_app, endpoint, body):
    async def gone() -> None:
        return  # the client has already left

    with pytest.raises(ClientDisconnected):
        handle(echo_app, endpoint, body, gone=gone)
    assert echo_app.host.scheduler.admitted == 0, "the queue place is freed"


def test_a_client_that_leaves_while_its_prompt_is_tokenized_never_reaches_the_engine(echo_app, monkeypatch):
    serving = echo_app.host.serving["completions"]
    tokenizing = threading.Event()
    tokenize = serving._tokenize_and_check

    def slow_tokenize(ctx):  # the client leaves during the text hop; the hop itself still ends normally
        tokenizing.set()
        assert ctx.cancel_event.wait(5)
        tokenize(ctx)

    async def gone() -> None:
        await asyncio.to_thread(tokenizing.wait, 5)

    monkeypatch.setattr(serving, "_tokenize_and_check", slow_tokenize)
    dispatched = count_dispatches(monkeypatch, echo_app.host.scheduler)
    with pytest.raises(ClientDisconnected):
        handle(echo_app, "completions", {"prompt": "hello", "max_tokens": 3}, gone=gone)
    assert len(dispatched) == 1, dispatched  # the text hop; the engine work was never handed over
    assert echo_app.host.scheduler.admitted == 0
