"""Generation logprobs and ``logit_bias`` on a GGUF model: computed in the child, carried over the wire."""

from __future__ import annotations

import pytest

from millm_engine_gguf import wire
from millm_host.api import GeneratedToken, TokenLogprob
from millm_host.testing import assert_error

from .conftest import DEFAULT_ID

MESSAGES = [{"role": "user", "content": "Tell me a story."}]


def test_a_token_with_logprobs_crosses_the_wire():
    token = GeneratedToken(42, -0.5, [TokenLogprob(42, -0.5), TokenLogprob(7, -1.25)])
    back = wire.frame_token(wire.token_frame(wire.TOKEN, token))
    assert isinstance(back, GeneratedToken)
    assert (int(back), back.logprob, back.top) == (42, -0.5, token.top)
    plain = wire.frame_token(wire.token_frame(wire.PAUSED, 42))
    assert plain == 42 and not isinstance(plain, GeneratedToken)


def check_greedy(token: str, logprob: float, top: dict[str, float]) -> None:
    assert logprob <= 0 and all(v <= 0 for v in top.values())
    assert logprob == pytest.approx(max(top.values()), abs=1e-5)
    assert top[token] == pytest.approx(logprob, abs=1e-6)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_through_the_sdk(gguf_server, stream):
    client = gguf_server.openai()
    kwargs = dict(model=DEFAULT_ID, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    if stream:
        entries, text = [], ""
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            if chunk.choices and chunk.choices[0].logprobs:
                entries.extend(chunk.choices[0].logprobs.content)
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
    else:
        reply = client.chat.completions.create(**kwargs)
        entries, text = reply.choices[0].logprobs.content, reply.choices[0].message.content
        assert len(entries) == reply.usage.completion_tokens
    assert entries and b"".join(bytes(e.bytes) for e in entries).decode() == text
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        check_greedy(entry.token, entry.logprob, {alt.token: alt.logprob for alt in entry.top_logprobs})


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_through_the_sdk(gguf_server, stream):
    client = gguf_server.openai()
    kwargs = dict(model=DEFAULT_ID, prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=2)
    if stream:
        tokens, logprobs, tops, text = [], [], [], ""
        for chunk in client.completions.create(stream=True, **kwargs):
            if chunk.choices and chunk.choices[0].logprobs:
                tokens += chunk.choices[0].logprobs.tokens
                logprobs += chunk.choices[0].logprobs.token_logprobs
                tops += chunk.choices[0].logprobs.top_logprobs
            text += chunk.choices[0].text if chunk.choices else ""
    else:
        choice = client.completions.create(**kwargs).choices[0]
        tokens, logprobs, tops, text = (
            choice.logprobs.tokens,
            choice.logprobs.token_logprobs,
            choice.logprobs.top_logprobs,
            choice.text,
        )
    assert len(tokens) == 5 and "".join(tokens) == text
    for token, logprob, top in zip(tokens, logprobs, tops, strict=True):
        check_greedy(token, logprob, top)


def test_logit_bias_forces_and_bans(gguf_server, reference_llama):
    client = gguf_server.openai()
    kwargs = dict(model=DEFAULT_ID, prompt="Once upon a time", max_tokens=3, temperature=0, logprobs=0)
    plain = client.completions.create(**kwargs).choices[0].logprobs.tokens
    (first_id,) = reference_llama.tokenize(plain[0].encode(), add_bos=False, special=True)
    forced_id = reference_llama.tokenize(b" zebra", add_bos=False)[0]
    forced_text = reference_llama.detokenize([forced_id]).decode()
    forced = client.completions.create(logit_bias={str(forced_id): 100}, **kwargs).choices[0].logprobs.tokens
    banned = client.completions.create(logit_bias={str(first_id): -100}, **kwargs).choices[0].logprobs.tokens
    assert forced == [forced_text] * 3
    assert banned[0] != plain[0]
    with gguf_server.http() as http:
        bad = http.post("/v1/completions", json={**kwargs, "prompt": "x", "logit_bias": {"10000000": 1}})
    assert_error(bad, 400, "invalid_parameter", "logit_bias")
