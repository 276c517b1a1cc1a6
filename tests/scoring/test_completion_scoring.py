"""Scoring mode on /v1/completions: numbers against a direct float32 forward, and every refusal."""

from __future__ import annotations

import math

import pytest
import torch

from millm_host.testing import assert_error
from millm_host.testing.openai_schema import validate_openai

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3,"]


def score(server, **body):
    with server.http() as client:
        return client.post("/v1/completions", json={"model": server.model_id, "max_tokens": 1, **body})


def ids_of(key: str) -> int:
    assert key.startswith("token_id:")
    return int(key.removeprefix("token_id:"))


def test_logprobs_equal_a_direct_float32_forward(tiny_server, reference):
    client = tiny_server.openai()
    model = tiny_server.model_id
    reply = client.completions.create(
        model=model, prompt=PROMPTS, max_tokens=1, logprobs=5, extra_body={"return_tokens_as_token_ids": True}
    )
    assert len(reply.choices) == len(PROMPTS)
    for choice, prompt in zip(reply.choices, PROMPTS, strict=True):
        expected = reference.logprobs(reference.ids(prompt))
        best = torch.topk(expected, 5)
        lp = choice.logprobs
        assert ids_of(lp.tokens[0]) == int(best.indices[0])
        assert lp.token_logprobs[0] == pytest.approx(float(best.values[0]), abs=1e-5)
        top = {ids_of(k): v for k, v in lp.top_logprobs[0].items()}
        assert set(top) == set(best.indices.tolist())
        for token, value in top.items():
            assert value == pytest.approx(float(expected[token]), abs=1e-5)
        assert lp.text_offset == [len(prompt)]
        assert choice.text == reference.tokenizer.decode([int(best.indices[0])], skip_special_tokens=True)
        assert choice.finish_reason == "length"
    assert reply.usage.prompt_tokens == sum(len(reference.ids(p)) for p in PROMPTS)
    assert reply.usage.completion_tokens == len(PROMPTS)


def test_token_id_prompts_and_text_keys(tiny_server, reference):
    ids = reference.ids(PROMPTS[0])
    body = score(tiny_server, prompt=ids, logprobs=3).json()
    lp = body["choices"][0]["logprobs"]
    expected = reference.logprobs(ids)
    best = torch.topk(expected, 3)
    texts = [reference.tokenizer.decode([int(i)]) for i in best.indices]
    assert lp["tokens"] == [texts[0]]
    for text, value in zip(texts, best.values, strict=True):
        assert lp["top_logprobs"][0][text] == pytest.approx(float(value), abs=1e-5)
    assert lp["text_offset"] == [len(reference.tokenizer.decode(ids))]
    validate_openai("CreateCompletionResponse", body)


@pytest.mark.parametrize("temperature", [0, 0.001, 0.7, 2])
def test_temperature_divides_the_logits(tiny_server, reference, temperature):
    body = score(
        tiny_server, prompt=PROMPTS[1], logprobs=2, temperature=temperature, return_tokens_as_token_ids=True
    ).json()
    expected = reference.logprobs(reference.ids(PROMPTS[1]), temperature)
    # Dividing by T scales the logits' float32 rounding too: compare at the logits' own scale.
    tolerance = 1e-5 / min(1, temperature) if temperature else 1e-5
    for key, value in body["choices"][0]["logprobs"]["top_logprobs"][0].items():
        assert value == pytest.approx(float(expected[ids_of(key)]), abs=tolerance)


def test_allowed_token_ids_normalise_over_the_set(tiny_server, reference):
    ids = reference.ids(PROMPTS[0])
    logits = reference.logits(ids)
    allowed = [int(torch.argmin(logits)), 1802, 3721, 42]  # the least likely token included
    body = score(
        tiny_server, prompt=PROMPTS[0], logprobs=2, allowed_token_ids=allowed, return_tokens_as_token_ids=True
    ).json()
    choice = body["choices"][0]
    # By hand: log p_i = l_i - log(sum_j exp(l_j)) over the set only.
    values = [float(logits[t]) for t in allowed]
    peak = max(values)
    log_z = peak + math.log(math.fsum(math.exp(v - peak) for v in values))
    by_hand = {t: v - log_z for t, v in zip(allowed, values, strict=True)}
    top = {ids_of(k): v for k, v in choice["logprobs"]["top_logprobs"][0].items()}
    assert set(top) == set(allowed), "every listed token is returned, whatever logprobs asks"
    for token, value in top.items():
        assert value == pytest.approx(by_hand[token], abs=1e-5)
    assert math.fsum(math.exp(v) for v in top.values()) == pytest.approx(1.0, abs=1e-6)
    best = max(allowed, key=lambda t: by_hand[t])
    assert ids_of(choice["logprobs"]["tokens"][0]) == best
    assert choice["text"] == reference.tokenizer.decode([best], skip_special_tokens=True)


def test_allowed_without_logprobs_constrains_and_returns_null(tiny_server, reference):
    ids = reference.ids(PROMPTS[2])
    logits = reference.logits(ids)
    allowed = [100, 200, 300]
    best = max(allowed, key=lambda t: float(logits[t]))
    body = score(tiny_server, prompt=PROMPTS[2], allowed_token_ids=allowed).json()
    assert body["choices"][0]["logprobs"] is None
    assert body["choices"][0]["text"] == reference.tokenizer.decode([best], skip_special_tokens=True)
    assert "scoring_precision" not in body
    validate_openai("CreateCompletionResponse", body)


def test_max_completion_tokens_one_and_seed_are_accepted(tiny_server):
    with tiny_server.http() as client:
        reply = client.post(
            "/v1/completions",
            json={"model": tiny_server.model_id, "prompt": "Hi", "max_completion_tokens": 1, "logprobs": 0, "seed": 7},
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["logprobs"]["top_logprobs"] == [{}]
    assert reply.headers["x-millm-seed"] == '7;scope="request"'


def test_sampling_fields_that_do_not_apply_are_reported(tiny_server):
    reply = score(tiny_server, prompt="Hi", logprobs=1, top_p=0.5, stop=["x"])
    assert reply.status_code == 200
    assert reply.headers["x-millm-ignored-fields"] == '"top_p", "stop"'
    with tiny_server.http() as client:
        strict = client.post(
            "/v1/completions",
            headers={"X-miLLM-Strict": "true"},
            json={"model": tiny_server.model_id, "prompt": "Hi", "max_tokens": 1, "logprobs": 1, "top_p": 0.5},
        )
    assert_error(strict, 400, "unused_fields_refused")


def test_float32_on_a_float32_model_is_scored_as_is(tiny_server):
    native = score(tiny_server, prompt=PROMPTS[0], logprobs=3).json()
    reply = score(tiny_server, prompt=PROMPTS[0], logprobs=3, scoring_precision="float32")
    assert reply.status_code == 200
    assert reply.headers["x-millm-scoring-precision"] == "float32"
    assert reply.json()["scoring_precision"] == "float32"
    assert reply.json()["choices"] == native["choices"]


REFUSALS = [
    # (body fields, status, code, param)
    # logprobs on a longer or streamed request is generation; allowed_token_ids is scoring at any length
    ({"prompt": "Hi", "allowed_token_ids": [5], "max_tokens": 5}, 400, "invalid_parameter", "max_tokens"),
    ({"prompt": "Hi", "allowed_token_ids": [5], "max_tokens": None}, 400, "invalid_parameter", "max_tokens"),
    ({"prompt": "Hi", "logprobs": 2, "n": 2}, 400, "invalid_parameter", "n"),
    ({"prompt": "Hi", "allowed_token_ids": [5], "stream": True}, 400, "invalid_parameter", "stream"),
    ({"prompt": "Hi", "logprobs": 2, "logit_bias": {"5": 1}}, 400, "field_not_honoured", "logit_bias"),
    ({"prompt": "Hi", "logprobs": 21}, 400, "invalid_parameter", "logprobs"),
    ({"prompt": "Hi", "logprobs": True}, 400, "invalid_parameter", "logprobs"),
    ({"prompt": "Hi", "logprobs": 2, "temperature": 0.0005}, 400, "invalid_parameter", "temperature"),
    ({"prompt": "Hi", "allowed_token_ids": []}, 400, "invalid_parameter", "allowed_token_ids"),
    ({"prompt": "Hi", "allowed_token_ids": [5, 10**7]}, 400, "invalid_scoring_request", "allowed_token_ids"),
    ({"prompt": "Hi", "allowed_token_ids": [-1]}, 400, "invalid_scoring_request", "allowed_token_ids"),
    ({"prompt": [5, 10**7], "logprobs": 1}, 400, "invalid_scoring_request", "prompt"),
    ({"prompt": "", "logprobs": 1}, 400, "invalid_scoring_request", "prompt"),
    ({"prompt": ["Hi", ""], "logprobs": 1, "add_special_tokens": False}, 400, "invalid_scoring_request", "prompt[1]"),
    ({"prompt": "word " * 600, "logprobs": 1}, 400, "context_length_exceeded", "prompt"),
    ({"prompt": "Hi", "logprobs": 1, "scoring_precision": "double"}, 400, "invalid_parameter", "scoring_precision"),
    ({"prompt": "Hi", "logprobs": 1, "top_logprobs": 2}, 400, "field_not_honoured", "top_logprobs"),
    # Scoring is never steered, constrained or monitored.
    ({"prompt": "Hi", "logprobs": 1, "profile": "humor"}, 400, "field_not_honoured", "profile"),
    ({"prompt": "Hi", "logprobs": 1, "steering_intensity": 0}, 400, "field_not_honoured", "steering_intensity"),
    ({"prompt": "Hi", "logprobs": 1, "steering": {"features": []}}, 400, "field_not_honoured", "steering"),
    (
        {"prompt": "Hi", "allowed_token_ids": [5], "response_format": {"type": "json_object"}},
        400,
        "field_not_honoured",
        "response_format",
    ),
    # Scoring-only fields outside scoring mode are refused, not ignored.
    ({"prompt": "Hi", "max_tokens": 2, "scoring_precision": "float32"}, 400, "field_not_honoured", "scoring_precision"),
    (
        {"prompt": "Hi", "max_tokens": 2, "return_tokens_as_token_ids": True},
        400,
        "field_not_honoured",
        "return_tokens_as_token_ids",
    ),
]


@pytest.mark.parametrize(("fields", "status", "code", "param"), REFUSALS)
def test_refusals(tiny_server, fields, status, code, param):
    error = assert_error(score(tiny_server, **fields), status, code, param)
    assert param.split("[")[0] in error["message"] or code == "context_length_exceeded"


def test_the_server_keeps_serving_after_refusals(tiny_server):
    assert score(tiny_server, prompt="Hi", logprobs=1).status_code == 200
    with tiny_server.http() as client:
        generated = client.post(
            "/v1/completions", json={"model": tiny_server.model_id, "prompt": "Hi", "max_tokens": 3, "temperature": 0}
        )
    assert generated.status_code == 200 and generated.json()["choices"][0]["logprobs"] is None


def test_native_precision_is_echoed_only_when_sent(tiny_server):
    sent = score(tiny_server, prompt="Hi", logprobs=1, scoring_precision="native")
    assert sent.headers["x-millm-scoring-precision"] == "native"
    assert sent.json()["scoring_precision"] == "native"
    unsent = score(tiny_server, prompt="Hi", logprobs=1)
    assert "x-millm-scoring-precision" not in unsent.headers and "scoring_precision" not in unsent.json()


def test_non_finite_logits_where_they_reach_the_answer(bf16_server, extra_models):
    from transformers import AutoTokenizer

    from .conftest import BROKEN_PROMPT, NAN_TOKEN, NEG_INF_TOKEN

    tokenizer = AutoTokenizer.from_pretrained(extra_models["broken"])
    (nan_id,) = tokenizer(NAN_TOKEN)["input_ids"]
    (neg_id,) = tokenizer(NEG_INF_TOKEN)["input_ids"]

    def broken(**fields):
        with bf16_server.http() as client:
            return client.post(
                "/v1/completions", json={"model": "broken", "prompt": BROKEN_PROMPT, "max_tokens": 1, **fields}
            )

    def assert_non_finite(reply, param):
        assert assert_error(reply, 500, "non_finite_logits", param)["type"] == "server_error"

    assert_non_finite(broken(logprobs=1), "prompt")  # NaN anywhere in an unrestricted vocabulary
    assert_non_finite(broken(logprobs=1, prompt=["Hello", BROKEN_PROMPT]), "prompt[0]")
    assert_non_finite(broken(allowed_token_ids=[11, nan_id]), "prompt")  # NaN on an allowed token
    assert_non_finite(broken(logprobs=2, allowed_token_ids=[11, neg_id]), "prompt")  # a reported -inf
    fine = broken(logprobs=1, allowed_token_ids=[11, 12], return_tokens_as_token_ids=True)
    assert fine.status_code == 200, "NaN outside the allowed set does not reach the answer"
    unreported = broken(allowed_token_ids=[11, neg_id])
    assert unreported.status_code == 200, "a -inf that is not reported is fine"
    assert unreported.json()["choices"][0]["text"] == tokenizer.decode([11], skip_special_tokens=True)
