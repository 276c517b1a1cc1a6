"""Chat completions through the official openai SDK and httpx.

What the host renders and refuses runs in-process on the echo engine (``echo_app``);
what a real model generates (sampling, seeds, stop sequences on real tokens)
runs on a tiny random model in a real server (``tiny_server``).
"""

from __future__ import annotations

import openai
import pytest

from millm_host.testing import assert_error, chat, chat_body, stream_post
from millm_host.testing.openai_schema import validate_openai


@pytest.fixture(scope="module")
def model_id(tiny_server) -> str:
    return tiny_server.model_id


@pytest.fixture(scope="module")
def echo(echo_app):
    return echo_app


def test_chat_response_matches_openai_schema(echo):
    with echo.http() as http:
        response = chat(http, "echo", max_tokens=5, temperature=0)
    assert response.status_code == 200
    body = response.json()
    validate_openai("CreateChatCompletionResponse", body)
    assert body["object"] == "chat.completion" and body["model"] == "echo"
    assert body["system_fingerprint"] == "millm:echo@unrecorded:unrecorded/unrecorded:echo"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello", "refusal": None}
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens"] == 5


def test_real_model_response_matches_openai_schema(tiny_server, model_id):
    with tiny_server.http() as http:
        response = chat(http, model_id, max_tokens=5, temperature=0)
    assert response.status_code == 200
    body = response.json()
    validate_openai("CreateChatCompletionResponse", body)
    # The tiny server batches (the default): the fingerprint says the reply shared a continuous batch.
    assert body["system_fingerprint"] == f"millm:{model_id}@unrecorded:float32/F32:transformers+continuous"
    assert 1 <= body["usage"]["completion_tokens"] <= 5


def test_sdk_chat_round_trip(tiny_server, model_id):
    reply = tiny_server.openai().chat.completions.create(
        model=model_id,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Again"},
        ],
        max_tokens=4,
        temperature=0,
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage.completion_tokens <= 4


def test_stream_chunks_match_openai_schema_and_order(echo):
    body = chat_body("echo", max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True})
    with echo.http() as http:
        response, events = stream_post(http, "/v1/chat/completions", body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for chunk in chunks:
        validate_openai("CreateChatCompletionStreamResponse", chunk)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    usage_chunk = chunks[-1]  # the last before [DONE], as OpenAI sends it; the only one without a choice
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 6
    assert all(c["choices"] and c["usage"] is None for c in chunks[:-1])
    assert {c["system_fingerprint"] for c in chunks} == {usage_chunk["system_fingerprint"]} != {None}
    final = chunks[-2]["choices"][0]
    assert final["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-2]) == "Hello "


def test_streamed_text_equals_non_streamed(tiny_server, model_id):
    client = tiny_server.openai()
    request = dict(
        model=model_id, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=24, temperature=0
    )
    whole = client.chat.completions.create(**request)
    parts, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **request):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert "".join(parts) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason


def test_n_choices(tiny_server, model_id):
    reply = tiny_server.openai().chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Hi"}], n=3, max_tokens=3, seed=11
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]


def test_n_with_stream_is_refused(echo):
    with echo.http() as http:
        response = http.post("/v1/chat/completions", json=chat_body("echo", n=2, stream=True))
    assert_error(response, 400, "invalid_parameter", "n")


def test_max_tokens_and_max_completion_tokens_must_agree(echo):
    with echo.http() as http:
        refused = http.post("/v1/chat/completions", json=chat_body("echo", max_tokens=3, max_completion_tokens=4))
        agreed = http.post(
            "/v1/chat/completions", json=chat_body("echo", max_tokens=3, max_completion_tokens=3, temperature=0)
        )
    error = assert_error(refused, 400, "invalid_parameter")
    assert "max_tokens" in error["param"] and "max_completion_tokens" in error["param"]
    assert agreed.status_code == 200


def test_max_completion_tokens_is_honoured(echo):
    reply = echo.openai().chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": "Count"}],
        max_completion_tokens=2,
        temperature=1,
        seed=3,
    )
    assert reply.usage.completion_tokens == 2 and reply.choices[0].message.content == "Co"


def test_seed_is_echoed_and_reproducible(tiny_server, model_id):
    client = tiny_server.openai()
    request = dict(model=model_id, messages=[{"role": "user", "content": "Write"}], max_tokens=16, temperature=1)
    first = client.chat.completions.with_raw_response.create(seed=7, **request)
    second = client.chat.completions.create(seed=7, **request)
    other = client.chat.completions.create(seed=8, **request)
    # The tiny server batches (the default): repeatable for the same batch shape, as here (one row at a time).
    assert first.headers["x-millm-seed"] == '7;scope="batch-shape"'
    assert first.parse().choices[0].message.content == second.choices[0].message.content
    assert other.choices[0].message.content != second.choices[0].message.content
    unseeded = client.chat.completions.with_raw_response.create(**request)
    assert "x-millm-seed" not in unseeded.headers


@pytest.mark.parametrize("value", [True, -1, 2**32, 1.5, "7", "abc"])
def test_invalid_seeds_are_refused(echo, value):
    with echo.http() as http:
        response = http.post("/v1/chat/completions", json=chat_body("echo", seed=value))
    assert_error(response, 400, "invalid_parameter", "seed")


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", 2.5),
        ("temperature", -0.1),
        ("temperature", "hot"),
        ("top_p", 1.5),
        ("frequency_penalty", 2.1),
        ("presence_penalty", -3),
        ("max_tokens", 0),
        ("n", 0),
        ("stop", 5),
    ],
)
def test_out_of_range_sampling_fields_are_refused(echo, field, value):
    with echo.http() as http:
        response = http.post("/v1/chat/completions", json=chat_body("echo", **{field: value}))
    assert_error(response, 400, "invalid_parameter", field)


def test_penalties_and_top_p_are_accepted(tiny_server, model_id):
    reply = tiny_server.openai().chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=8,
        temperature=0.8,
        top_p=0.9,
        frequency_penalty=1.5,
        presence_penalty=0.5,
        seed=1,
    )
    assert reply.usage.completion_tokens >= 1


def _greedy_text(client, model_id, **extra):
    reply = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=32, temperature=0, **extra
    )
    return reply.choices[0]


def test_stop_sequences_cut_the_text_streaming_or_not(tiny_server, model_id):
    client = tiny_server.openai()
    full = _greedy_text(client, model_id).message.content
    assert len(full) > 20, full
    stop = full[10:14]
    expected = full[: full.index(stop)]
    cut = _greedy_text(client, model_id, stop=[stop, "\u2603never"])
    assert cut.message.content == expected and cut.finish_reason == "stop"
    deltas = []
    for chunk in client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=32,
        temperature=0,
        stop=stop,
        stream=True,
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            deltas.append(chunk.choices[0].delta.content)
    assert "".join(deltas) == expected
    assert all(stop not in "".join(deltas[: i + 1]) for i in range(len(deltas)))


def test_stream_options_without_stream_is_refused(echo):
    with echo.http() as http:
        response = http.post("/v1/chat/completions", json=chat_body("echo", stream_options={"include_usage": True}))
    assert_error(response, 400, "invalid_parameter", "stream_options")


def test_sdk_raises_typed_errors(echo):
    client = echo.openai()
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="x", messages=[])
