"""The feature plugins beside a GGUF model: steering says `none`, nothing else changes."""

from __future__ import annotations

import json

from .conftest import DEFAULT_ID, needs_steering

CHAT = {"model": DEFAULT_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}


@needs_steering
def test_every_completion_says_it_was_not_steered(gguf_server):
    with gguf_server.http() as http:
        chat = http.post("/v1/chat/completions", json=CHAT)
        completion = http.post("/v1/completions", json={"model": DEFAULT_ID, "prompt": "Hi", "max_tokens": 2})
        with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as stream:
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert chat.headers["x-millm-steering"] == "none"
    assert completion.headers["x-millm-steering"] == "none"
    assert lines[-1] == "data: [DONE]"
    final = json.loads(lines[-2][len("data: ") :])
    assert final["millm_steering"] == "none" and final["choices"][0]["finish_reason"] is not None
    assert "millm_probe_verdicts" not in chat.json()
