"""Steering on ``/v1/messages`` (Anthropic's Messages API): served as a chat completion, it is steered and
says so the same way: ``X-miLLM-Steering``, the inline ``steering`` field, and a stream's last event."""

from __future__ import annotations

import json

from millm_host.api import parse_list


def members(value):
    return [(str(m.value), dict(m.params)) for m in parse_list(value)]


def create(client, model_id, **fields):
    body = {"model": model_id, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}], **fields}
    return client.post("/v1/messages", json=body)


def test_unsteered_says_none(client, model_id):
    response = create(client, model_id)
    assert response.status_code == 200, response.text
    assert response.headers["x-millm-steering"] == "none"


def test_live_and_inline_steering_carry_the_header(client, attach, model_id):
    attach("sae-a")
    client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 7, "strength": 2.0}]})
    [(kind, params)] = members(create(client, model_id).headers["x-millm-steering"])
    assert kind == "manual" and params["sae"] == "sae-a"
    inline = create(client, model_id, steering={"sae_id": "sae-a", "features": [{"index": 3, "strength": 1.0}]})
    assert inline.status_code == 200, inline.text
    [(kind, params)] = members(inline.headers["x-millm-steering"])
    assert kind == "inline" and params["features"] == 1


def test_a_bad_steering_field_is_refused_in_anthropics_shape(client, model_id):
    response = create(client, model_id, steering={"sae_id": "no-such-sae", "features": [{"index": 3, "strength": 1}]})
    assert 400 <= response.status_code < 500, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["param"].startswith("steering")


def test_a_stream_names_its_steering_on_its_last_delta(client, attach, model_id):
    attach("sae-a")
    client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 7, "strength": 2.0}]})
    body = {"model": model_id, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    with client.stream("POST", "/v1/messages", json=body) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    [(kind, _)] = members(events[-2]["millm_steering"])
    assert kind == "manual"
