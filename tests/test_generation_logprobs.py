"""Generation logprobs (``logprobs``/``top_logprobs`` with max_tokens > 1, streamed or not) and ``logit_bias``.

The shapes, the routing against scoring mode and the refusals run in-process on
the echo engine (greedy: its scripted token has logit 0, every other -20); the
real distribution through the openai SDK on a tiny transformers model. The GGUF
engine's are in ``plugins/engine_gguf/tests/test_gguf_logprobs.py``.
"""

from __future__ import annotations

import math

import pytest

from millm_host.testing import assert_error, chat_body, stream_post
from millm_host.testing.openai_schema import validate_openai

#: log-softmax of the echo engine's scripted token: logit 0 against 256 others at -20.
ECHO_CHOSEN = -math.log1p(256 * math.exp(-20.0))


def post_chat(http, **fields):
    return http.post("/v1/chat/completions", json=chat_body("echo", "Hi you", **fields))


def post_completion(http, **fields):
    return http.post("/v1/completions", json={"model": "echo", "prompt": "Hi you", **fields})


# --- in-process: shapes, routing, refusals (echo engine) ------------------------------


def test_chat_logprobs_cover_every_generated_token(echo_app):
    with echo_app.http() as http:
        body = post_chat(http, max_tokens=4, logprobs=True, top_logprobs=3).json()
    validate_openai("CreateChatCompletionResponse", body)
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Hi y"
    content = choice["logprobs"]["content"]
    assert [entry["token"] for entry in content] == ["H", "i", " ", "y"]
    for entry in content:
        assert entry["logprob"] == pytest.approx(ECHO_CHOSEN)
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0] == {k: entry[k] for k in ("token", "logprob", "bytes")}
        assert all(t["logprob"] <= 0 for t in entry["top_logprobs"])


def test_completion_logprobs_in_the_legacy_shape(echo_app):
    with echo_app.http() as http:
        body = post_completion(http, max_tokens=3, logprobs=2).json()
    validate_openai("CreateCompletionResponse", body)
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["H", "i", " "]
    assert logprobs["token_logprobs"] == pytest.approx([ECHO_CHOSEN] * 3)
    assert logprobs["text_offset"] == [6, 7, 8]  # after the 6-character prompt
    assert [len(top) for top in logprobs["top_logprobs"]] == [2, 2, 2]
    assert all(
        top[token] == lp
        for top, token, lp in zip(logprobs["top_logprobs"], logprobs["tokens"], logprobs["token_logprobs"], strict=True)
    )


def test_logprobs_zero_reports_only_the_sampled_token(echo_app):
    with echo_app.http() as http:
        completion = post_completion(http, max_tokens=2, logprobs=0).json()["choices"][0]["logprobs"]
        chat = post_chat(http, max_tokens=2, logprobs=True).json()["choices"][0]["logprobs"]
    assert completion["top_logprobs"] == [
        {"H": completion["token_logprobs"][0]},
        {"i": completion["token_logprobs"][1]},
    ]
    assert [entry["top_logprobs"] for entry in chat["content"]] == [[], []]


def test_without_logprobs_the_field_is_null(echo_app):
    with echo_app.http() as http:
        assert post_chat(http, max_tokens=2).json()["choices"][0]["logprobs"] is None
        assert post_chat(http, max_tokens=2, logprobs=False).json()["choices"][0]["logprobs"] is None
        assert post_completion(http, max_tokens=2, logprobs=False).json()["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_streamed_chunks_carry_the_logprobs_of_their_tokens(echo_app, endpoint):
    fields = {"max_tokens": 5, "stream": True}
    with echo_app.http() as http:
        if endpoint == "chat":
            body, path = chat_body("echo", "Hi you", logprobs=True, top_logprobs=2, **fields), "/v1/chat/completions"
        else:
            body, path = {"model": "echo", "prompt": "Hi you", "logprobs": 2, **fields}, "/v1/completions"
        response, events = stream_post(http, path, body)
        whole = http.post(path, json={**body, "stream": False}).json()["choices"][0]["logprobs"]
    assert response.status_code == 200
    chunks = [e for e in events[:-1] if e["choices"] and e["choices"][0]["logprobs"]]
    if endpoint == "chat":
        streamed = [entry for c in chunks for entry in c["choices"][0]["logprobs"]["content"]]
        texts = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
        assert streamed == whole["content"]
        assert texts == "".join(entry["token"] for entry in streamed) == "Hi yo"
    else:
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            assert [v for c in chunks for v in c["choices"][0]["logprobs"][key]] == whole[key]
        assert "".join(c["choices"][0]["text"] for c in chunks) == "Hi yo"


def test_a_stop_sequence_keeps_the_logprobs_of_every_counted_token(echo_app):
    with echo_app.http() as http:
        body = post_completion(http, max_tokens=6, logprobs=1, stop=[" y"]).json()
    choice = body["choices"][0]
    assert choice["text"] == "Hi"
    assert len(choice["logprobs"]["tokens"]) == body["usage"]["completion_tokens"]


def test_max_tokens_one_is_still_scoring_mode(echo_app):
    # The echo engine cannot score: a scoring request is refused, a generation one served.
    with echo_app.http() as http:
        scoring = post_chat(http, max_tokens=1, logprobs=True)
        streamed, _ = stream_post(
            http, "/v1/chat/completions", chat_body("echo", max_tokens=1, logprobs=True, stream=True)
        )
        generation = post_completion(http, max_tokens=2, logprobs=1)
    assert_error(scoring, 400, "field_not_honoured", "logprobs")
    assert streamed.status_code == 200
    assert generation.status_code == 200


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": 3}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "return_tokens_as_token_ids": True}, "return_tokens_as_token_ids"),
        ({"logit_bias": {"abc": 5}}, "logit_bias"),
        ({"logit_bias": {"-1": 5}}, "logit_bias"),
        ({"logit_bias": {"72": 101}}, "logit_bias"),
        ({"logit_bias": {"72": -100.5}}, "logit_bias"),
        ({"logit_bias": {"72": "5"}}, "logit_bias.72"),
        ({"logit_bias": {"999999": 5}}, "logit_bias"),
        ({"logit_bias": [5]}, "logit_bias"),
    ],
)
def test_bad_logprobs_and_logit_bias_are_400s(echo_app, fields, param):
    with echo_app.http() as http:
        response = post_chat(http, max_tokens=3, **fields)
    error = assert_error(response, 400, response.json()["error"]["code"], param)
    assert error["code"] in ("invalid_parameter", "field_not_honoured")


def test_completion_logprobs_past_twenty_is_a_400(echo_app):
    with echo_app.http() as http:
        assert_error(post_completion(http, max_tokens=3, logprobs=21), 400, "invalid_parameter", "logprobs")


def test_logit_bias_forces_and_bans_tokens(echo_app):
    z, h = ord("z"), ord("H")
    with echo_app.http() as http:
        forced = post_chat(http, max_tokens=3, logit_bias={str(z): 100}).json()["choices"][0]["message"]["content"]
        banned = post_completion(http, max_tokens=1, logit_bias={str(h): -100}).json()["choices"][0]["text"]
        plain = post_completion(http, max_tokens=1).json()["choices"][0]["text"]
    assert forced == "zzz"
    assert plain == "H" and banned != "H"


def test_logit_bias_shows_in_the_logprobs(echo_app):
    with echo_app.http() as http:
        body = post_chat(http, max_tokens=1, stream=True, logprobs=True, top_logprobs=2, logit_bias={"122": 20})
    # +20 lifts "z" to the scripted token's logit: two tokens share nearly all the mass
    chunks = [c for c in _events(body) if c["choices"] and c["choices"][0]["logprobs"]]
    top = chunks[0]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert {t["token"] for t in top} == {"H", "z"}
    assert [t["logprob"] for t in top] == pytest.approx([math.log(0.5)] * 2, abs=1e-6)


def _events(response):
    import json

    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]


# --- a real model through the openai SDK (tiny transformers model) ---------------------


@pytest.fixture(scope="module")
def client(tiny_server):
    return tiny_server.openai()


@pytest.fixture(scope="module")
def model_id(tiny_server):
    return tiny_server.model_id


MESSAGES = [{"role": "user", "content": "Tell me a story."}]


def check_greedy_entries(entries) -> None:
    """Every logprob ≤ 0, and greedy: the chosen token is the most probable of its alternatives."""
    for entry in entries:
        assert entry.logprob <= 0
        assert all(alt.logprob <= 0 for alt in entry.top_logprobs)
        assert entry.logprob == pytest.approx(max(alt.logprob for alt in entry.top_logprobs), abs=1e-5)
        assert entry.top_logprobs[0].token == entry.token


def test_chat_logprobs_through_the_sdk(client, model_id):
    reply = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=4
    )
    choice = reply.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace") == choice.message.content
    check_greedy_entries(entries)
    assert all(len(e.top_logprobs) == 4 for e in entries)


def test_streamed_chat_logprobs_through_the_sdk(client, model_id):
    kwargs = dict(model=model_id, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    whole = client.chat.completions.create(**kwargs)
    entries, text = [], ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if chunk.choices and chunk.choices[0].logprobs:
            entries.extend(chunk.choices[0].logprobs.content)
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == whole.choices[0].message.content
    assert [(e.token, round(e.logprob, 4)) for e in entries] == [
        (e.token, round(e.logprob, 4)) for e in whole.choices[0].logprobs.content
    ]
    check_greedy_entries(entries)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_through_the_sdk(client, model_id, stream):
    kwargs = dict(model=model_id, prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=3)
    if stream:
        tokens, token_logprobs, tops, offsets, text = [], [], [], [], ""
        for chunk in client.completions.create(stream=True, **kwargs):
            if chunk.choices and chunk.choices[0].logprobs:
                lp = chunk.choices[0].logprobs
                tokens += lp.tokens
                token_logprobs += lp.token_logprobs
                tops += lp.top_logprobs
                offsets += lp.text_offset
            text += chunk.choices[0].text if chunk.choices else ""
    else:
        reply = client.completions.create(**kwargs)
        lp = reply.choices[0].logprobs
        tokens, token_logprobs, tops, offsets, text = (
            lp.tokens,
            lp.token_logprobs,
            lp.top_logprobs,
            lp.text_offset,
            reply.choices[0].text,
        )
    assert len(tokens) == 5
    assert offsets[0] == len("Once upon a time")
    assert all(b - a == len(t) for a, b, t in zip(offsets, offsets[1:], tokens, strict=False))
    for token, logprob, top in zip(tokens, token_logprobs, tops, strict=True):
        assert logprob <= 0 and all(v <= 0 for v in top.values())
        assert top[token] == pytest.approx(logprob) and logprob == pytest.approx(max(top.values()), abs=1e-5)
    assert "".join(tokens) == text


def test_sampled_tokens_have_their_own_logprobs(client, model_id):
    reply = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=8, temperature=1.5, seed=3, logprobs=True, top_logprobs=20
    )
    for entry in reply.choices[0].logprobs.content:
        assert entry.logprob <= 0
        listed = {alt.token: alt.logprob for alt in entry.top_logprobs}
        if entry.token in listed:  # the sampled token need not be among the 20 best
            assert listed[entry.token] == pytest.approx(entry.logprob, abs=1e-5)


def test_logit_bias_forces_and_bans_on_a_real_model(client, model_id, tiny_model_dir):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    kwargs = dict(model=model_id, prompt="Once upon a time", max_tokens=4, temperature=0)
    plain = client.completions.create(logprobs=1, **kwargs).choices[0]
    first = tokenizer.encode(plain.logprobs.tokens[0], add_special_tokens=False)[0]
    forced_id = tokenizer.encode(" zebra", add_special_tokens=False)[0]
    forced = client.completions.create(logit_bias={str(forced_id): 100}, **kwargs).choices[0].text
    banned = client.completions.create(logit_bias={str(first): -100}, logprobs=1, **kwargs).choices[0]
    assert forced == tokenizer.decode([forced_id] * 4)
    assert banned.logprobs.tokens[0] != plain.logprobs.tokens[0]


def test_a_logit_bias_id_outside_the_vocabulary_is_a_400(tiny_server, model_id):
    with tiny_server.http() as http:
        response = http.post(
            "/v1/completions", json={"model": model_id, "prompt": "x", "max_tokens": 2, "logit_bias": {"10000000": 1}}
        )
    assert "outside the vocabulary" in assert_error(response, 400, "invalid_parameter", "logit_bias")["message"]
