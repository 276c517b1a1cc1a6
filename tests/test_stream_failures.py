"""Failures after a stream started: an error event, then [DONE]; the app keeps serving.

In-process on the echo engine, failed by the fault-injection test plugin.
"""

from __future__ import annotations

import openai
import pytest

from millm_host.testing import assert_error, chat, chat_body, stream_post


@pytest.fixture(scope="module")
def faulty(app_factory):
    return app_factory(plugins=["fault_injection"], env={"FAULT_INJECTION": "token:3"})


def test_mid_stream_failure_is_an_error_event_before_done(faulty):
    with faulty.http() as http:
        response, events = stream_post(
            http, "/v1/chat/completions", chat_body(faulty.model_id, content="FAULT please", max_tokens=20, stream=True)
        )
    assert response.status_code == 200
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["code"] == "injected_fault" and error["message"]
    deltas = [e for e in events[:-2] if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert 1 <= len(deltas) <= 3  # some text was already sent


def test_the_openai_sdk_raises_on_the_error_event(faulty):
    client = faulty.openai()
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(
            model=faulty.model_id, stream=True, max_tokens=20, messages=[{"role": "user", "content": "FAULT"}]
        ):
            pass


def test_non_streamed_failure_is_an_error_response(faulty):
    with faulty.http() as http:
        response = chat(http, faulty.model_id, "FAULT", max_tokens=20)
        healthy = chat(http, faulty.model_id, "fine", max_tokens=20)
    assert_error(response, 500, "injected_fault")
    assert healthy.status_code == 200


def test_out_of_memory_mid_stream(app_factory):
    app = app_factory(plugins=["fault_injection"], env={"FAULT_INJECTION": "oom:2"})
    with app.http() as http:
        _, events = stream_post(
            http, "/v1/chat/completions", chat_body(app.model_id, content="FAULT", max_tokens=10, stream=True)
        )
        plain = chat(http, app.model_id, "FAULT", max_tokens=10)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "insufficient_memory"
    error = assert_error(plain, 503, "insufficient_memory")
    assert error["type"] == "invalid_request_error"
