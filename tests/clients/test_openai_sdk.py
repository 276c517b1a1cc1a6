"""The official openai SDK (2.x): sync, async, stream helpers, ``.parse``, tools, embeddings, logprobs, errors."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest


@pytest.fixture(scope="module")
def client(server):
    return server.openai()


def test_chat_sync(client, model, scripted):
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, extra_headers=scripted("Hello there")
    )
    assert reply.choices[0].message.content == "Hello there"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens > 0


def test_chat_async(server, model, scripted):
    async def ask():
        async with openai.AsyncOpenAI(base_url=server.v1, api_key="not-needed", max_retries=0) as client:
            whole = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, extra_headers=scripted("Hi!")
            )
            stream = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=8,
                stream=True,
                extra_headers=scripted("Hi!"),
            )
            parts = [chunk.choices[0].delta.content or "" async for chunk in stream]
            return whole.choices[0].message.content, "".join(parts)

    whole, streamed = asyncio.run(ask())
    assert whole == streamed == "Hi!"


def test_every_chat_chunk_has_a_choice_and_a_fingerprint(client, model, scripted):
    """The standard loop ``chunk.choices[0].delta`` must not hit an empty ``choices`` (issue 12 §1)."""
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            stream=True,
            extra_headers=scripted("Hello there"),
        )
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == "Hello there"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(chunk.system_fingerprint for chunk in chunks)


def test_every_completion_chunk_has_a_choice(client, model, scripted):
    chunks = list(
        client.completions.create(model=model, prompt="Say", max_tokens=8, stream=True, extra_headers=scripted(" hi"))
    )
    assert "".join(chunk.choices[0].text for chunk in chunks) == " hi"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_include_usage_puts_usage_last(client, model, scripted):
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=scripted("Hello there"),
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(chunk.choices and chunk.usage is None for chunk in chunks[:-1])


def test_stream_helper_reports_text_and_usage(client, model, scripted):
    with client.chat.completions.stream(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        stream_options={"include_usage": True},
        extra_headers=scripted("Hello there"),
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == final.choices[0].message.content == "Hello there"
    assert final.usage is not None and final.usage.completion_tokens > 0


def test_parse_a_pydantic_model(client, model, shapes):
    reply = client.chat.completions.parse(
        model=model, messages=shapes.QUESTION, response_format=shapes.Weather, max_tokens=60
    )
    weather = reply.choices[0].message.parsed
    assert isinstance(weather, shapes.Weather)
    assert set(json.loads(reply.choices[0].message.content)) == {"city", "sunny"}


def test_parse_without_strict_has_no_padding_keys(client, model):
    """An object that lists ``properties`` without ``additionalProperties`` gets only those keys (issue 12 §3)."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
    }
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "weather?"}],
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}},
    )
    assert reply.choices[0].finish_reason == "stop"
    assert set(json.loads(reply.choices[0].message.content)) == {"city", "sunny"}


def test_stream_helper_with_a_pydantic_response_format(client, model, shapes):
    with client.chat.completions.stream(
        model=model, messages=shapes.QUESTION, response_format=shapes.Weather, max_tokens=60
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, shapes.Weather)


def test_pydantic_common_types_are_served(client, model, scripted):
    """What pydantic emits for common types is served, not refused (issue 12 §3), as instructor sends it.

    The reply is scripted (a random model would write strings no post-check accepts):
    the point is that the schema is accepted and a valid document comes back.
    """
    import datetime
    import enum
    import uuid
    from typing import Literal

    from pydantic import BaseModel, Field

    class Room(enum.Enum):
        single = "single"
        double = "double"

    class Guest(BaseModel):
        name: str
        email: str = Field(json_schema_extra={"format": "email"})

    class Booking(BaseModel):
        day: datetime.date
        arrival: datetime.datetime
        checkin: datetime.time
        ref: uuid.UUID
        guests: int = Field(gt=0, lt=10)
        tags: set[str]
        room: Room
        view: Literal["sea", "garden"]
        note: str | None
        lead: Guest
        extras: dict[str, int]

    document = (
        '{"day": "2025-05-01", "arrival": "2025-05-01T14:30:00Z", "checkin": "14:30:00",'
        ' "ref": "1b4e28ba-2fa1-11d2-883f-0016d3b5f2a5", "guests": 2, "tags": ["quiet"], "room": "double",'
        ' "view": "sea", "note": null, "lead": {"name": "Ada", "email": "ada@example.com"}, "extras": {"bed": 1}}'
    )
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "book"}],
        max_tokens=200,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "booking", "schema": Booking.model_json_schema()},
        },
        extra_headers=scripted(document),
    )
    assert Booking.model_validate_json(reply.choices[0].message.content).guests == 2


def test_tool_call_named(client, model, shapes):
    reply = client.chat.completions.create(
        model=model,
        messages=shapes.QUESTION,
        tools=[shapes.WEATHER_TOOL],
        max_tokens=40,
        tool_choice={"type": "function", "function": {"name": "GetWeather"}},
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.type == "function" and call.function.name == "GetWeather" and call.id
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    assert reply.choices[0].finish_reason in ("tool_calls", "stop")


def test_tool_call_required(client, model, shapes):
    reply = client.chat.completions.create(
        model=model,
        messages=shapes.QUESTION,
        tools=[shapes.WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,  # one call: a random model's list of calls has no end within max_tokens
        max_tokens=40,
    )
    calls = reply.choices[0].message.tool_calls
    assert calls and all(call.function.name == "GetWeather" for call in calls)


def test_tool_choice_none_answers_in_text(client, model, shapes, scripted):
    reply = client.chat.completions.create(
        model=model,
        messages=shapes.QUESTION,
        tools=[shapes.WEATHER_TOOL],
        tool_choice="none",
        max_tokens=8,
        extra_headers=scripted("Sunny."),
    )
    assert reply.choices[0].message.content == "Sunny." and not reply.choices[0].message.tool_calls


def test_streamed_tool_call_through_the_stream_helper(client, model, shapes):
    with client.chat.completions.stream(
        model=model,
        messages=shapes.QUESTION,
        tools=[openai.pydantic_function_tool(shapes.GetWeather)],
        tool_choice="required",
        parallel_tool_calls=False,  # one call: a random model's list of calls has no end within max_tokens
        max_tokens=40,
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, shapes.GetWeather)


def test_tool_history_renders(client, model, shapes, scripted):
    messages = [
        *shapes.QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "GetWeather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"},
    ]
    reply = client.chat.completions.create(
        model=model, messages=messages, tools=[shapes.WEATHER_TOOL], max_tokens=8, extra_headers=scripted("Sunny.")
    )
    assert reply.choices[0].message.content == "Sunny."


def test_embeddings(client, model):
    reply = client.embeddings.create(model=model, input=["hello world", "goodbye"])  # the SDK asks for base64
    first, second = (item.embedding for item in reply.data)
    assert len(first) == len(second) > 0 and first != second


def test_embeddings_of_token_ids(client, model):
    text = client.embeddings.create(model=model, input=["hello"]).data[0].embedding
    ids = client.embeddings.create(model=model, input=[[28120], [28120, 905]])
    assert len(ids.data) == 2 and len(ids.data[0].embedding) == len(text)


def test_chat_logprobs(client, model):
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5, logprobs=True, top_logprobs=2
    )
    tokens = reply.choices[0].logprobs.content
    assert len(tokens) == reply.usage.completion_tokens
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in tokens)


def test_completion_logprobs_streamed(client, model):
    chunks = list(
        client.completions.create(
            model=model, prompt="Once", max_tokens=4, logprobs=2, stream=True, stream_options={"include_usage": True}
        )
    )
    logprobs = [
        lp
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs
        for lp in chunk.choices[0].logprobs.token_logprobs
    ]
    assert len(logprobs) == chunks[-1].usage.completion_tokens and all(lp <= 0 for lp in logprobs)


def test_responses_api(client, model, scripted):
    reply = client.responses.create(
        model=model, input="hi", instructions="Be brief.", max_output_tokens=16, extra_headers=scripted("Hello there")
    )
    assert reply.output_text == "Hello there"
    events = [
        e.type
        for e in client.responses.create(
            model=model, input="hi", max_output_tokens=16, stream=True, extra_headers=scripted("Hello there")
        )
    ]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert "response.output_text.delta" in events


def test_unknown_model_is_not_found(client, model):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["code"] == "model_not_found"
    assert model in caught.value.body["message"]  # the 404 names the models that exist


def test_bad_request_is_a_bad_request_error(client, model):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], temperature=7)
    assert caught.value.body["param"] == "temperature"
    # the server keeps serving
    assert client.models.retrieve(model).id == model
