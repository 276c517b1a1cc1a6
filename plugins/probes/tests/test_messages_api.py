"""Probe verdicts on ``/v1/messages`` (Anthropic's Messages API): served as a chat completion, it is
monitored the same way: ``X-miLLM-Probe-Verdicts`` and ``millm_probe_verdicts`` in the message, and on a
stream's ``message_delta``; the same scores as the same conversation sent to chat completions."""

from __future__ import annotations

import json

import pytest

from millm_host.api import parse_list

CONVERSATION = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def armed(probes_server, lab, identity, helpers):
    doc = lab.definition(identity, name="stakes-m", behaviour="high-stakes", rule="max", windows=["all"])
    with probes_server.http() as http, helpers.armed(http, [doc]) as (probe_id,):
        yield probe_id


def test_a_message_carries_the_verdicts_chat_would(probes_server, armed, model_id):
    body = {"model": model_id, "max_tokens": 5, "temperature": 0}
    with probes_server.http() as http:
        message = http.post("/v1/messages", json={**body, "messages": CONVERSATION})
        chat = http.post("/v1/chat/completions", json={**body, "messages": CONVERSATION})
    assert message.status_code == chat.status_code == 200, message.text
    results = message.json()["millm_probe_verdicts"]
    assert [r["probe_id"] for r in results] == [armed]
    [member] = parse_list(message.headers["x-millm-probe-verdicts"])
    assert dict(member.params)["probe"] == armed
    scores = [r["score"] for r in chat.json()["millm_probe_verdicts"]]
    assert [r["score"] for r in results] == pytest.approx(scores, abs=1e-6)


def test_a_stream_carries_the_verdicts_on_its_message_delta(probes_server, armed, model_id):
    body = {"model": model_id, "max_tokens": 5, "messages": CONVERSATION, "stream": True}
    with probes_server.http() as http:
        with http.stream("POST", "/v1/messages", json=body) as response:
            events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    results = events[-2]["millm_probe_verdicts"]
    assert [r["probe_id"] for r in results] == [armed] and all(r["status"] == "final" for r in results)
