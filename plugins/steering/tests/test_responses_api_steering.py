"""Steering on ``/v1/responses``: served as a chat completion, it is steered and says so the same way."""

from __future__ import annotations

import json

from millm_host.api import parse_list


def members(value):
    return [(str(m.value), dict(m.params)) for m in parse_list(value)]


def respond(client, model_id, **fields):
    return client.post("/v1/responses", json={"model": model_id, "input": "Hi", "max_output_tokens": 4, **fields})


def test_unsteered_says_none(client, model_id):
    response = respond(client, model_id)
    assert response.status_code == 200, response.text
    assert response.headers["x-millm-steering"] == "none"


def test_live_and_inline_steering_carry_the_header(client, attach, model_id):
    attach("sae-a")
    client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 7, "strength": 2.0}]})
    [(kind, params)] = members(respond(client, model_id).headers["x-millm-steering"])
    assert kind == "manual" and params["sae"] == "sae-a"
    inline = respond(client, model_id, steering={"sae_id": "sae-a", "features": [{"index": 3, "strength": 1.0}]})
    assert inline.status_code == 200, inline.text
    [(kind, params)] = members(inline.headers["x-millm-steering"])
    assert kind == "inline" and params["features"] == 1


def test_a_stream_names_its_steering_on_the_final_response(client, attach, model_id):
    attach("sae-a")
    client.put("/api/steering", json={"sae_id": "sae-a", "features": [{"index": 7, "strength": 2.0}]})
    body = {"model": model_id, "input": "Hi", "max_output_tokens": 4, "stream": True}
    with client.stream("POST", "/v1/responses", json=body) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")  # 4 tokens may cut it
    [(kind, _)] = members(events[-1]["response"]["millm_steering"])
    assert kind == "manual"
