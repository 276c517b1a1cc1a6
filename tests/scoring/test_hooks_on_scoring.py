"""Scoring and embeddings are never steered nor monitored, yet plugins still render headers and extras."""

from __future__ import annotations

import pytest

CHAT = [{"role": "user", "content": "hi"}]


def post(server, path, **body):
    with server.http() as client:
        return client.post(path, json={"model": "bf16", "user": "report", **body})


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "logprobs": 2}),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "logprobs": True}),
    ],
)
def test_scoring_skips_the_forward_hooks_and_renders_headers_and_extras(bf16_server, path, body):
    reply = post(bf16_server, path, **body)
    assert reply.status_code == 200, reply.text
    # render_headers ran after everything else, with ctx.scoring and ctx.finished set.
    assert reply.headers["x-test-hooks"] == "validate_request,after_tokenize;scoring=1;finished=1"
    assert reply.json()["test_hooks"] == ["validate_request", "after_tokenize"]
    assert reply.headers["x-millm-model"] == "bf16"
    if "x-millm-steering" in reply.headers or _steering_installed(bf16_server):
        assert reply.headers["x-millm-steering"] == "none"  # the steering plugin stands aside


def test_generation_calls_them_for_contrast(bf16_server):
    reply = post(bf16_server, "/v1/chat/completions", messages=CHAT, max_tokens=1)
    assert reply.headers["x-test-hooks"] == (
        "validate_request,after_tokenize,before_forward,after_generate;scoring=0;finished=1"
    )


def test_embeddings_skip_the_forward_hooks(bf16_server):
    reply = post(bf16_server, "/v1/embeddings", input="Hi")
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-test-hooks"] == "validate_request,after_tokenize;scoring=0;finished=1"
    assert "x-millm-steering" not in reply.headers  # embeddings never generate


def _steering_installed(server) -> bool:
    with server.http() as client:
        return any(p["name"] == "steering" for p in client.get("/api/health").json()["plugins"])
