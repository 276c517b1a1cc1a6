"""vLLM's ``ignore_eos`` and ``min_tokens``, and ``stream_options.continuous_usage_stats``.

The refusals and the usage on every chunk run in-process on the echo engine (which
honours neither EOS field: they are refused there); the EOS mask through the openai
SDK on a tiny transformers model, where ``logit_bias`` makes EOS the model's every
choice, so only the mask can hold it back. The GGUF engine's are in
``plugins/engine_gguf/tests/test_gguf_eos_fields.py``.
"""

from __future__ import annotations

import pytest

from millm_host.testing import assert_error, chat_body, stream_post

# --- in-process (echo engine) ---------------------------------------------------------


@pytest.mark.parametrize("field", [{"ignore_eos": True}, {"min_tokens": 2}])
def test_an_engine_that_does_not_mask_eos_refuses_the_fields(echo_app, field):
    name = next(iter(field))
    with echo_app.http() as http:
        response = http.post("/v1/chat/completions", json=chat_body("echo", "Hi", max_tokens=4, **field))
        plain = http.post(
            "/v1/completions", json={"model": "echo", "prompt": "Hi", "ignore_eos": False, "min_tokens": 0}
        )
    assert_error(response, 400, "field_not_honoured", name)
    assert plain.status_code == 200, plain.text  # the values that change nothing are accepted


def test_min_tokens_past_max_tokens_is_a_400(echo_app):
    with echo_app.http() as http:
        response = http.post(
            "/v1/completions", json={"model": "echo", "prompt": "Hi", "max_tokens": 2, "min_tokens": 3}
        )
    assert_error(response, 400, "invalid_parameter", "min_tokens")


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_continuous_usage_stats_puts_usage_on_every_chunk(echo_app, endpoint, include_usage):
    options = {"include_usage": include_usage, "continuous_usage_stats": True}
    if endpoint == "chat":
        path, body = "/v1/chat/completions", chat_body("echo", "Hi you", max_tokens=5)
    else:
        path, body = "/v1/completions", {"model": "echo", "prompt": "Hi you", "max_tokens": 5}
    with echo_app.http() as http:
        response, events = stream_post(http, path, {**body, "stream": True, "stream_options": options})
    assert response.status_code == 200 and events[-1] == "[DONE]"
    chunks = events[:-1]
    usages = [c["usage"] for c in chunks]
    assert all(u is not None for u in usages), chunks
    prompt = usages[0]["prompt_tokens"]
    assert all(u["prompt_tokens"] == prompt and u["total_tokens"] == prompt + u["completion_tokens"] for u in usages)
    completion = [u["completion_tokens"] for u in usages]
    assert completion == sorted(completion) and completion[-1] == 5
    usage_only = [c for c in chunks if not c["choices"]]
    assert len(usage_only) == (1 if include_usage else 0)  # the last usage chunk is include_usage's


# --- a real model through the openai SDK (tiny transformers model) ---------------------


@pytest.fixture(scope="module")
def eos_bias(tiny_model_dir):
    """A ``logit_bias`` that makes the tokenizer's EOS every next token (greedy)."""
    import transformers

    return {str(transformers.AutoTokenizer.from_pretrained(tiny_model_dir).eos_token_id): 100}


@pytest.mark.parametrize("stream", [False, True])
def test_eos_fields_on_a_real_model(tiny_server, eos_bias, stream):
    client = tiny_server.openai()

    def run(**extra):
        kwargs = dict(model=tiny_server.model_id, prompt="Once upon a time", max_tokens=7, temperature=0)
        kwargs["extra_body"] = {"logit_bias": eos_bias, **extra}
        if not stream:
            reply = client.completions.create(**kwargs)
            return reply.choices[0].finish_reason, reply.usage.completion_tokens
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
        return next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason), chunks[
            -1
        ].usage.completion_tokens

    assert run() == ("stop", 0)  # EOS first
    assert run(min_tokens=4) == ("stop", 4)  # EOS masked from the first 4 draws
    assert run(ignore_eos=True) == ("length", 7)  # masked from every draw


def test_min_tokens_holds_a_stop_sequence_back(tiny_server):
    client = tiny_server.openai()
    kwargs = dict(model=tiny_server.model_id, prompt="Once upon a time", max_tokens=8, temperature=0)
    text = client.completions.create(**kwargs).choices[0].text
    stop = text[:2]
    assert client.completions.create(stop=[stop], **kwargs).choices[0].text == ""
    held = client.completions.create(stop=[stop], extra_body={"min_tokens": 3}, **kwargs).choices[0]
    assert held.text.startswith(stop) and len(held.text) > len(stop)
