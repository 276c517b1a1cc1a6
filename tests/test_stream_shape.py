"""The shape of a stream, as OpenAI clients read it (issue 12 §1).

Every chunk has a choice, so ``chunk.choices[0]`` works in the plainest loop; the
plugins' extras ride on the last ``finish_reason`` chunk; only the usage chunk
(``stream_options.include_usage``) has no choice, and it is the last before
``[DONE]``; every chunk carries ``system_fingerprint``. The logic runs in-process on
the echo engine; the openai SDK's loops and helpers run against a real server on
the tiny model, where the steering plugin adds ``millm_steering`` to every stream.
"""

from __future__ import annotations

from typing import Any

import pytest

from millm_host.api import MillmError, ResponseExtra, hookimpl
from millm_host.testing import chat_body, stream_post


class TwoExtras:
    """A test plugin: two extras on every generation, the later ``order`` merged last."""

    @hookimpl
    def response_extras(self, ctx) -> list[ResponseExtra] | None:
        if ctx.scoring or ctx.endpoint not in ("chat.completions", "completions"):
            return None
        return [ResponseExtra({"late": 2, "shared": "late"}, 900), ResponseExtra({"early": 1, "shared": "early"}, 10)]


@pytest.fixture(scope="module")
def extras_app(app_factory):
    return app_factory(register=[TwoExtras()])


def _stream(app, path: str, body: dict[str, Any]) -> list[Any]:
    with app.http() as http:
        response, events = stream_post(http, path, body)
    assert response.status_code == 200, response.text
    assert events[-1] == "[DONE]"
    return events[:-1]


def _finish_chunks(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_every_chunk_has_a_choice_and_the_extras_ride_on_the_finish_chunk(extras_app, endpoint):
    body = (
        chat_body("echo", max_tokens=4, stream=True)
        if endpoint == "chat"
        else {"model": "echo", "prompt": "Once upon a time", "max_tokens": 4, "stream": True}
    )
    chunks = _stream(extras_app, f"/v1/{'chat/' if endpoint == 'chat' else ''}completions", body)
    assert all(c["choices"] for c in chunks)
    assert all("usage" not in c for c in chunks)  # not asked for: not sent, as OpenAI does
    (finish,) = _finish_chunks(chunks)
    assert finish is chunks[-1]
    assert (finish["early"], finish["late"], finish["shared"]) == (1, 2, "late")  # merged in ``order``
    assert not any("early" in c or "late" in c for c in chunks[:-1])


def test_several_prompts_put_the_extras_on_the_last_finish_chunk_only(extras_app):
    body = {"model": "echo", "prompt": ["Once upon", "A B C", "1 2 3"], "max_tokens": 3, "stream": True}
    chunks = _stream(extras_app, "/v1/completions", body)
    finishes = _finish_chunks(chunks)
    assert [f["choices"][0]["index"] for f in finishes] == [0, 1, 2]
    assert finishes[-1] is chunks[-1] and chunks[-1]["early"] == 1
    assert not any("early" in c for c in chunks[:-1])
    assert all(c["choices"] for c in chunks)


def test_include_usage_sends_the_usage_chunk_last(extras_app):
    body = chat_body("echo", max_tokens=4, stream=True, stream_options={"include_usage": True})
    chunks = _stream(extras_app, "/v1/chat/completions", body)
    *rest, usage_chunk = chunks
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 4
    assert not any(key in usage_chunk for key in ("early", "late"))  # the extras stay on the finish chunk
    assert all(c["choices"] and c["usage"] is None for c in rest)
    assert rest[-1]["choices"][0]["finish_reason"] == "length" and rest[-1]["late"] == 2


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_every_chunk_carries_the_system_fingerprint(extras_app, path):
    body = (
        chat_body("echo", max_tokens=3) if "chat" in path else {"model": "echo", "prompt": "Hi there", "max_tokens": 3}
    )
    with extras_app.http() as http:
        whole = http.post(path, json=body).json()
        _, events = stream_post(http, path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert whole["system_fingerprint"].startswith("millm:")
    assert {e["system_fingerprint"] for e in events[:-1]} == {whole["system_fingerprint"]}


class FailAfterGenerate:
    """A test plugin: fails every request that says FAULT once its generation has ended."""

    @hookimpl
    def after_generate(self, ctx) -> None:
        if any("FAULT" in (m.get("content") or "") for conv in ctx.conversations for m in conv):
            raise MillmError("the output broke its contract", code="after_fault", status=500, type="server_error")


def test_a_failure_after_generation_sends_the_finish_chunk_then_the_error_event(app_factory):
    app = app_factory(register=[TwoExtras(), FailAfterGenerate()])
    chunks = _stream(app, "/v1/chat/completions", chat_body("echo", "FAULT here", max_tokens=3, stream=True))
    *rest, error = chunks
    assert error == {"error": error["error"]} and error["error"]["code"] == "after_fault"  # as before: unchanged
    assert rest[-1]["choices"][0]["finish_reason"] == "length" and "early" not in rest[-1]
    assert all(c["choices"] for c in rest)


# --- the openai SDK against a real server (the steering plugin's millm_steering is an extra) ---------


@pytest.fixture(scope="module")
def client(tiny_server):
    return tiny_server.openai()


@pytest.fixture(scope="module")
def model_id(tiny_server) -> str:
    return tiny_server.model_id


MESSAGES = [{"role": "user", "content": "Tell me a story"}]


def test_the_plain_chat_loop_reads_choices_0_of_every_chunk(client, model_id):
    whole = client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=8, temperature=0)
    text, chunks = "", []
    for chunk in client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=8, temperature=0, stream=True
    ):
        text += chunk.choices[0].delta.content or ""  # the loop every tutorial writes
        chunks.append(chunk)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].model_extra["millm_steering"] == "none"  # the extras ride on the finish chunk
    assert {c.system_fingerprint for c in chunks} == {whole.system_fingerprint}


def test_the_plain_completion_loop_reads_choices_0_of_every_chunk(client, model_id):
    whole = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=8, temperature=0)
    chunks = list(
        client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].model_extra["millm_steering"] == "none"


def test_the_stream_helper_reports_usage_from_the_last_chunk(client, model_id):
    whole = client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=6, temperature=0)
    with client.chat.completions.stream(
        model=model_id, messages=MESSAGES, max_tokens=6, temperature=0, stream_options={"include_usage": True}
    ) as stream:
        events = [event for event in stream if event.type == "chunk"]
    # the snapshot get_final_completion() would parse (it refuses finish_reason "length" as unparseable)
    final, chunks = events[-1].snapshot, [event.chunk for event in events]
    assert final.usage is not None and final.usage.completion_tokens == whole.usage.completion_tokens
    assert final.choices[0].message.content == whole.choices[0].message.content
    assert final.system_fingerprint == whole.system_fingerprint
    assert chunks[-1].choices == [] and chunks[-1].usage == final.usage
    assert chunks[-2].choices[0].finish_reason and chunks[-2].model_extra["millm_steering"] == "none"
