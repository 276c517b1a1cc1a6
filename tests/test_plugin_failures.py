"""Policy ``rendering``: a plugin whose render_headers or response_extras raises never fails a response."""

from __future__ import annotations

import pytest

from millm_host.headers import parse_list
from millm_host.testing import chat_body, stream_post


@pytest.fixture(scope="module")
def faulty(app_factory):
    return app_factory(plugins=["fault_injection"], env={"FAULT_INJECTION": "rendering"})


def _named(header: str) -> list[str]:
    return [member.value for member in parse_list(header)]


def test_a_failing_plugin_is_left_out_of_a_generated_response_and_named(faulty):
    with faulty.http() as http:
        response = http.post("/v1/chat/completions", json=chat_body(faulty.model_id, content="FAULT", max_tokens=4))
        healthy = http.post("/v1/chat/completions", json=chat_body(faulty.model_id, content="fine", max_tokens=4))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert _named(response.headers["x-millm-plugin-errors"]) == ["fault_injection"]
    assert response.headers["x-millm-model"] == faulty.model_id  # the other plugins' headers stay
    assert healthy.status_code == 200 and "x-millm-plugin-errors" not in healthy.headers


def test_text_completions_too(faulty):
    with faulty.http() as http:
        completion = http.post("/v1/completions", json={"model": faulty.model_id, "prompt": "FAULT", "max_tokens": 2})
    assert completion.status_code == 200, completion.text
    assert _named(completion.headers["x-millm-plugin-errors"]) == ["fault_injection"]


def test_a_stream_names_the_plugin_in_its_header_and_its_last_chunk(faulty):
    with faulty.http() as http:
        response, events = stream_post(
            http, "/v1/chat/completions", chat_body(faulty.model_id, content="FAULT", max_tokens=4, stream=True)
        )
    assert response.status_code == 200
    assert _named(response.headers["x-millm-plugin-errors"]) == ["fault_injection"]
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"  # they ride on the finish chunk
    assert events[-2]["millm_plugin_errors"] == ["fault_injection"]
    assert all("millm_plugin_errors" not in e for e in events[:-2])


def test_extras_failing_after_a_stream_opened_are_named_in_the_last_chunk(faulty):
    with faulty.http() as http:
        response, events = stream_post(
            http, "/v1/chat/completions", chat_body(faulty.model_id, content="FAULT-EXTRAS", max_tokens=4, stream=True)
        )
        healthy, plain = stream_post(
            http, "/v1/chat/completions", chat_body(faulty.model_id, content="fine", max_tokens=4, stream=True)
        )
    assert response.status_code == 200 and "x-millm-plugin-errors" not in response.headers
    assert events[-2]["millm_plugin_errors"] == ["fault_injection"] and events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert healthy.status_code == 200 and not any("millm_plugin_errors" in e for e in plain if isinstance(e, dict))
