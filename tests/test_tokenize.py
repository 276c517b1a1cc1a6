"""POST /tokenize and /detokenize: the count is generation's usage.prompt_tokens; refusals are OpenAI-shaped.

Logic in-process on the echo engine (its token ids are UTF-8 bytes); the real engines through a
real server on the tiny model here and on the default GGUF model in ``plugins/engine_gguf``.
"""

from __future__ import annotations

import pytest

from millm_host.testing import assert_error

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


def tokenize(server, **body):
    with server.http() as http:
        return http.post("/tokenize", json={"model": server.model_id, **body})


def test_counts_are_the_usage_generation_reports(echo_app):
    with echo_app.http() as http:
        chat = http.post("/v1/chat/completions", json={"model": "echo", "messages": MESSAGES}).json()
        completion = http.post("/v1/completions", json={"model": "echo", "prompt": "Once upon"}).json()
    chat_tokens = tokenize(echo_app, messages=MESSAGES).json()
    assert chat_tokens["count"] == len(chat_tokens["tokens"]) == chat["usage"]["prompt_tokens"]
    assert chat_tokens["max_model_len"] == 512
    prompt_tokens = tokenize(echo_app, prompt="Once upon").json()
    assert prompt_tokens == {"count": 9, "max_model_len": 512, "tokens": list(b"Once upon")}
    assert prompt_tokens["count"] == completion["usage"]["prompt_tokens"]


def test_detokenize_round_trips_the_rendered_chat(echo_app):
    ids = tokenize(echo_app, messages=MESSAGES, return_token_strs=True).json()
    with echo_app.http() as http:
        text = http.post("/detokenize", json={"model": "echo", "tokens": ids["tokens"]}).json()["prompt"]
    assert text == "<|system|>Be brief.<|end|><|user|>Hello there<|end|><|assistant|>"
    assert "".join(ids["token_strs"]) == text


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": MESSAGES}, "messages"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}, "add_generation_prompt"),
        ("/detokenize", {"tokens": [72, 257]}, "tokens[1]"),
        ("/detokenize", {"tokens": [72, -1]}, "tokens[1]"),
        ("/detokenize", {}, "tokens"),
    ],
)
def test_refusals_name_the_parameter(echo_app, path, fields, param):
    with echo_app.http() as http:
        response = http.post(path, json={"model": "echo", **fields})
    assert_error(response, 400, "invalid_parameter", param)


def test_an_unknown_model_is_404(echo_app):
    with echo_app.http() as http:
        error = assert_error(http.post("/detokenize", json={"model": "nope", "tokens": [1]}), 404, "model_not_found")
    assert "'echo'" in error["message"]


def test_guarded_by_the_api_keys_like_v1(app_factory):
    app = app_factory(env={"MILLM_API_KEYS": "client-key", "MILLM_ADMIN_API_KEYS": "admin-key"})
    with app.http() as http:
        assert_error(http.post("/tokenize", json={"model": "echo", "prompt": "a"}), 401, "invalid_api_key")
        ok = http.post(
            "/tokenize", json={"model": "echo", "prompt": "a"}, headers={"Authorization": "Bearer client-key"}
        )
    assert ok.status_code == 200, ok.text


def test_the_tiny_model_counts_what_chat_and_completions_report(tiny_server):
    """The transformers engine, through a real server: tokenize, then generate, the same count."""
    client = tiny_server.openai()
    chat = client.chat.completions.create(model=tiny_server.model_id, messages=MESSAGES, max_tokens=1)
    completion = client.completions.create(model=tiny_server.model_id, prompt="Once upon a time", max_tokens=1)
    chat_tokens = tokenize(tiny_server, messages=MESSAGES).json()
    assert chat_tokens["count"] == chat.usage.prompt_tokens
    assert tokenize(tiny_server, prompt="Once upon a time").json()["count"] == completion.usage.prompt_tokens
    with tiny_server.http() as http:
        text = http.post("/detokenize", json={"model": tiny_server.model_id, "tokens": chat_tokens["tokens"]}).json()
    assert text["prompt"].startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert text["prompt"].endswith("<|im_start|>assistant\n")
    assert (
        tokenize(tiny_server, prompt=text["prompt"], add_special_tokens=False).json()["tokens"]
        == (chat_tokens["tokens"])
    )
