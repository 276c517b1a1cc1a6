"""Token inputs and model names on the GGUF engine, through the server: /tokenize, /detokenize,
token-id embeddings, and the default model's Hugging Face id as an alias."""

from __future__ import annotations

import numpy as np

from millm_host.testing import assert_error

from .conftest import DEFAULT_ID

MESSAGES = [{"role": "user", "content": "Hello there"}]


def test_tokenize_counts_what_chat_and_completions_report(gguf_server):
    client = gguf_server.openai()
    chat = client.chat.completions.create(model=DEFAULT_ID, messages=MESSAGES, max_tokens=1)
    completion = client.completions.create(model=DEFAULT_ID, prompt="Once upon a time", max_tokens=1)
    with gguf_server.http() as http:
        chat_tokens = http.post("/tokenize", json={"model": DEFAULT_ID, "messages": MESSAGES}).json()
        prompt_tokens = http.post("/tokenize", json={"model": DEFAULT_ID, "prompt": "Once upon a time"}).json()
        text = http.post("/detokenize", json={"model": DEFAULT_ID, "tokens": chat_tokens["tokens"]}).json()["prompt"]
    assert chat_tokens["count"] == chat.usage.prompt_tokens
    assert prompt_tokens["count"] == completion.usage.prompt_tokens
    assert text.endswith("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n")


def test_token_ids_embed_as_the_text_they_come_from(gguf_server, offline_tiktoken):
    """Token ids are OpenAI's (cl100k_base, the default): they embed as the text they encode."""
    text = "The quick brown fox."
    ids = offline_tiktoken.get_encoding("cl100k_base").encode_ordinary(text)
    with gguf_server.http() as http:
        by_text = http.post("/v1/embeddings", json={"model": DEFAULT_ID, "input": text}).json()
        by_ids = http.post("/v1/embeddings", json={"model": DEFAULT_ID, "input": [ids]}).json()
        outside = http.post("/v1/embeddings", json={"model": DEFAULT_ID, "input": [ids, [1, 10**6]]})
    np.testing.assert_allclose(by_ids["data"][0]["embedding"], by_text["data"][0]["embedding"], rtol=1e-5, atol=1e-6)
    assert by_ids["usage"] == by_text["usage"]
    assert_error(outside, 400, "invalid_parameter", "input[1][1]")


def test_the_hugging_face_id_names_the_default_model(gguf_server):
    reply = gguf_server.openai().chat.completions.create(
        model="HuggingFaceTB/SmolLM2-135M-Instruct", messages=MESSAGES, max_tokens=1
    )
    assert reply.model == DEFAULT_ID
