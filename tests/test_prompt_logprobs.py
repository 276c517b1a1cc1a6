"""The prompt's own logprobs on ``/v1/completions``: ``echo`` with ``logprobs`` and vLLM's ``prompt_logprobs``.

Refusals and ``echo`` alone run in-process on the echo engine (which cannot score);
the numbers through the openai SDK on a tiny transformers model, checked against
scoring mode's answer for each prefix of the prompt. The GGUF engine refuses them
(``plugins/engine_gguf/tests/test_gguf_fields.py``).
"""

from __future__ import annotations

import pytest

from millm_host.testing import assert_error, stream_post

# --- in-process (echo engine: no scoring) --------------------------------------------


def post(http, **fields):
    return http.post("/v1/completions", json={"model": "echo", "prompt": "Hi you", **fields})


def test_echo_alone_puts_the_prompt_before_the_completion(echo_app):
    with echo_app.http() as http:
        body = post(http, max_tokens=3, echo=True).json()
        _, events = stream_post(
            http,
            "/v1/completions",
            {"model": "echo", "prompt": "Hi you", "max_tokens": 3, "echo": True, "stream": True},
        )
    assert body["choices"][0]["text"] == "Hi youHi "
    assert body["usage"]["completion_tokens"] == 3
    assert "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"]) == "Hi youHi "
    assert events[0]["choices"][0]["text"] == "Hi you"  # the prompt comes first, alone


@pytest.mark.parametrize(
    ("fields", "param"), [({"echo": True, "logprobs": 1}, "echo"), ({"prompt_logprobs": 1}, "prompt_logprobs")]
)
def test_an_engine_that_cannot_score_refuses_the_prompts_logprobs(echo_app, fields, param):
    with echo_app.http() as http:
        response = post(http, max_tokens=1, **fields)
    assert "cannot" in assert_error(response, 400, "field_not_honoured", param)["message"]


def test_max_tokens_zero_needs_echo_or_prompt_logprobs(echo_app):
    with echo_app.http() as http:
        response = post(http, max_tokens=0)
        echoed = post(http, max_tokens=0, echo=True).json()
    assert_error(response, 400, "invalid_parameter", "max_tokens")
    assert echoed["choices"][0]["text"] == "Hi you" and echoed["usage"]["completion_tokens"] == 0
    assert echoed["choices"][0]["finish_reason"] == "length"


# --- a real model (tiny transformers model) --------------------------------------------


@pytest.fixture(scope="module")
def prompt_ids(tiny_server):
    """A prompt of token ids: some text, then its greedy continuation (so scoring's best is the prompt's token)."""
    client = tiny_server.openai()
    with tiny_server.http() as http:
        head = http.post("/tokenize", json={"model": tiny_server.model_id, "prompt": "The cat sat on the"}).json()
    ids = head["tokens"]
    more = client.completions.create(model=tiny_server.model_id, prompt=ids, max_tokens=4, temperature=0, logprobs=0)
    with tiny_server.http() as http:
        tail = http.post(
            "/tokenize",
            json={"model": tiny_server.model_id, "prompt": more.choices[0].text, "add_special_tokens": False},
        ).json()
    return ids + tail["tokens"]


def scored(tiny_server, ids):
    """Scoring mode's answer after ``ids``: (its best token, {token: logprob} of its 5 best)."""
    client = tiny_server.openai()
    reply = client.completions.create(model=tiny_server.model_id, prompt=ids, max_tokens=1, logprobs=5, temperature=0)
    lp = reply.choices[0].logprobs
    return lp.tokens[0], lp.token_logprobs[0], lp.top_logprobs[0]


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_logprobs_are_scoring_modes_numbers(tiny_server, prompt_ids, max_tokens):
    """lm-evaluation-harness's request (``echo: true, logprobs: 1``; max_tokens 1, or 0)."""
    client = tiny_server.openai()
    reply = client.completions.create(
        model=tiny_server.model_id, prompt=prompt_ids, max_tokens=max_tokens, temperature=0, logprobs=5, echo=True
    )
    choice = reply.choices[0]
    prompt_text = client.completions.create(model=tiny_server.model_id, prompt=prompt_ids, max_tokens=0, echo=True)
    prompt_text = prompt_text.choices[0].text
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt_ids) + max_tokens == reply.usage.total_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert choice.text == "".join(lp.tokens) and choice.text.startswith(prompt_text)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    greedy = 0  # prompt tokens that are scoring's best: their own logprob is compared too
    for position in range(1, len(prompt_ids)):
        best, best_logprob, top = scored(tiny_server, prompt_ids[:position])
        echoed_top = lp.top_logprobs[position]
        assert set(top) <= set(echoed_top)  # the same 5 best (and the prompt's token)
        for token, logprob in top.items():
            assert echoed_top[token] == pytest.approx(logprob, abs=1e-5)
        if lp.tokens[position] == best:
            assert lp.token_logprobs[position] == pytest.approx(best_logprob, abs=1e-5)
            greedy += 1
    assert greedy >= 4  # at least the greedy continuation the prompt ends with
    greedy_tail = range(len(prompt_ids) - 4, len(prompt_ids))
    assert all(lp.token_logprobs[i] == pytest.approx(max(lp.top_logprobs[i].values())) for i in greedy_tail)


def test_prompt_logprobs_in_vllms_shape(tiny_server, prompt_ids):
    client = tiny_server.openai()
    kwargs = dict(model=tiny_server.model_id, prompt=prompt_ids, temperature=0)
    reply = client.completions.create(max_tokens=0, extra_body={"prompt_logprobs": 2}, **kwargs)
    echo = client.completions.create(max_tokens=0, echo=True, logprobs=2, **kwargs).choices[0].logprobs
    listed = reply.choices[0].model_extra["prompt_logprobs"]
    assert reply.choices[0].text == "" and len(listed) == len(prompt_ids) and listed[0] is None
    for position, entry in enumerate(listed[1:], start=1):
        mine = entry[str(prompt_ids[position])]
        assert mine["logprob"] == echo.token_logprobs[position] and mine["decoded_token"] == echo.tokens[position]
        assert mine["rank"] >= 1 and len(entry) in (2, 3)  # its 2 best, and it when it is not among them
        ranks = sorted(v["rank"] for k, v in entry.items() if k != str(prompt_ids[position]) or v["rank"] <= 2)
        assert ranks[:2] == [1, 2]
    streamed = list(client.completions.create(stream=True, max_tokens=2, extra_body={"prompt_logprobs": 2}, **kwargs))
    assert streamed[0].choices[0].model_extra["prompt_logprobs"] == listed


def test_streamed_echo_sends_the_prompt_and_its_logprobs_first(tiny_server, prompt_ids):
    client = tiny_server.openai()
    kwargs = dict(model=tiny_server.model_id, prompt=prompt_ids, max_tokens=3, temperature=0, logprobs=1, echo=True)
    whole = client.completions.create(**kwargs).choices[0]
    chunks = list(client.completions.create(stream=True, **kwargs))
    first = chunks[0].choices[0]
    assert first.logprobs.tokens == whole.logprobs.tokens[: len(prompt_ids)]
    assert first.logprobs.token_logprobs[0] is None
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.text
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == whole.logprobs.tokens
