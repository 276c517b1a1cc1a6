"""The official anthropic SDK against ``/v1/messages``: create, both streams, system prompts, stop sequences,
tools (a ``tool_use`` reply and a ``tool_result`` turn), count_tokens, refusals in Anthropic's shape, and
greedy answers equal to the same conversation's chat completion, token for token.

One server for the module (the suite's ``server``: the tiny model, scripted output enabled). The tiny
model's template takes no tools, so tools go through the generic format (see ``shapes.GENERIC_*``).
"""

from __future__ import annotations

import json

import anthropic
import pytest

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "name": "get_weather",
    "description": "Get the weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"],
    },
}
#: The SDK (2.x) no longer has sampling parameters; the API still takes them, and so does millm.
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def client(server):
    with anthropic.Anthropic(base_url=server.base_url, api_key="not-needed", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def http(server):
    with server.http() as http:
        yield http


def test_create(client, model, scripted):
    reply = client.messages.create(
        model=model, max_tokens=16, messages=[{"role": "user", "content": "hi"}], extra_headers=scripted("Hello there")
    )
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert [block.type for block in reply.content] == ["text"] and reply.content[0].text == "Hello there"
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    assert reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0
    assert reply.model == model


def test_max_tokens_cuts_the_answer(client, model, scripted):
    reply = client.messages.create(
        model=model, max_tokens=2, messages=[{"role": "user", "content": "hi"}], extra_headers=scripted("one two three")
    )
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 2


def test_stream_helper(client, model, scripted):
    with client.messages.stream(
        model=model, max_tokens=16, messages=[{"role": "user", "content": "hi"}], extra_headers=scripted("Hello there")
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == "Hello there"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0 and final.usage.input_tokens > 0


def test_stream_true_sends_anthropics_events(client, model, scripted):
    events = list(
        client.messages.create(
            model=model,
            max_tokens=16,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_headers=scripted("Hello there"),
        )
    )
    kinds = [event.type for event in events if event.type != "ping"]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == "Hello there"
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason == "end_turn" and delta.usage.output_tokens > 0


def prompt_tokens(usage) -> int:
    """Anthropic counts a prompt in parts: ``input_tokens`` is only what was not read from the prefix cache."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_system_prompt_as_a_string_or_blocks(client, model):
    """The system prompt reaches the template (SmolLM2's puts its own in when there is none), and its two
    spellings are the same prompt."""
    ask = {"model": model, "max_tokens": 6, "messages": QUESTION, "extra_body": GREEDY}
    bare = client.messages.create(**ask)
    text = client.messages.create(**ask, system="Answer in one word.")
    blocks = client.messages.create(
        **ask, system=[{"type": "text", "text": "Answer in "}, {"type": "text", "text": "one word."}]
    )
    assert prompt_tokens(text.usage) == prompt_tokens(blocks.usage) != prompt_tokens(bare.usage)
    assert blocks.usage.cache_read_input_tokens > 0  # the same prompt again: its prefix came from the cache
    assert text.content == blocks.content


def test_stop_sequences(client, model, scripted):
    ask = {
        "model": model,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
        "stop_sequences": ["STOP", "."],
        "extra_headers": scripted("Hello there. Bye"),
    }
    reply = client.messages.create(**ask)
    assert reply.content[0].text == "Hello there"
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "."
    with client.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "Hello there" and final.stop_sequence == "."


def test_tool_use_then_tool_result(client, model, scripted, shapes):
    """A scripted call comes back as a tool_use block; the tool's result goes back in a user turn."""
    reply = client.messages.create(
        model=model, max_tokens=60, messages=QUESTION, tools=[WEATHER], extra_headers=scripted(shapes.GENERIC_CALL)
    )
    assert reply.stop_reason == "tool_use"
    (call,) = reply.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"} and call.id
    history = [
        *QUESTION,
        {"role": "assistant", "content": reply.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "24 C"}]}],
        },
    ]
    answer = client.messages.create(
        model=model, max_tokens=60, messages=history, tools=[WEATHER], extra_headers=scripted(shapes.GENERIC_ANSWER)
    )
    assert answer.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in answer.content] == [("text", "Sunny in Paris.")]


def test_tool_choice_tool_streams_input_json(client, model):
    """A named tool: the model (unscripted) must call it; its input streams as input_json_delta pieces."""
    with client.messages.stream(
        model=model,
        max_tokens=60,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as stream:
        pieces = [e.delta.partial_json for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    (call,) = final.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.input["city"] in ("Paris", "Rome")
    assert json.loads("".join(pieces)) == call.input
    assert final.stop_reason == "tool_use"


def test_tool_choice_any_and_none(client, model, scripted):
    called = client.messages.create(
        model=model,
        max_tokens=60,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    assert [block.type for block in called.content] == ["tool_use"]
    text = client.messages.create(
        model=model,
        max_tokens=8,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice={"type": "none"},
        extra_headers=scripted("Sunny."),
    )
    assert [(b.type, b.text) for b in text.content] == [("text", "Sunny.")]


def test_structured_output(client, model):
    """``output_config.format`` constrains the answer to the schema (the structured_output plugin's grammar)."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    reply = client.messages.create(
        model=model,
        max_tokens=60,
        messages=QUESTION,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert reply.stop_reason == "end_turn"
    assert set(json.loads(reply.content[0].text)) == {"city", "sunny"}


def test_count_tokens_is_the_prompt_create_runs(client, model):
    system = "Be brief."
    count = client.messages.count_tokens(model=model, system=system, messages=QUESTION)
    reply = client.messages.create(model=model, max_tokens=1, system=system, messages=QUESTION)
    assert count.input_tokens == prompt_tokens(reply.usage) > 0
    tools = {"tools": [WEATHER], "tool_choice": {"type": "any"}}
    with_tools = client.messages.count_tokens(model=model, system=system, messages=QUESTION, **tools)
    called = client.messages.create(model=model, max_tokens=60, system=system, messages=QUESTION, **tools)
    assert with_tools.input_tokens == prompt_tokens(called.usage) > count.input_tokens  # the tools are in the prompt


def test_greedy_answers_equal_chat_completions(client, http, model):
    """The same conversation through /v1/chat/completions: the same prompt, the same tokens."""
    conversation = [
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "A small model."},
        {"role": "user", "content": "Tell me a story."},
    ]
    chat = http.post(
        "/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "system", "content": "Be kind."}, *conversation],
            "max_tokens": 12,
            "temperature": 0,
        },
    ).json()
    messages = [
        {
            "role": m["role"],
            "content": [{"type": "text", "text": m["content"]}] if m["role"] == "user" else m["content"],
        }
        for m in conversation
    ]
    ask = {"model": model, "max_tokens": 12, "system": "Be kind.", "messages": messages, "extra_body": GREEDY}
    reply = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        streamed = "".join(stream.text_stream)
    expected = chat["choices"][0]["message"]["content"]
    assert "".join(block.text for block in reply.content) == streamed == expected
    assert prompt_tokens(reply.usage) == chat["usage"]["prompt_tokens"]
    assert reply.usage.output_tokens == chat["usage"]["completion_tokens"]
    assert reply.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[chat["choices"][0]["finish_reason"]]
    # and token for token: the ids of both texts, tokenized alike
    ids = [
        http.post("/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False}).json()["tokens"]
        for text in (expected, streamed)
    ]
    assert ids[0] == ids[1]


def test_millm_headers_and_fields(client, model, scripted):
    raw = client.messages.with_raw_response.create(
        model=model,
        max_tokens=4,
        messages=[{"role": "user", "content": "hi"}],
        metadata={"user_id": "u-1"},
        extra_body={"seed": 7},
        extra_headers=scripted("Hi"),
    )
    assert raw.headers["x-millm-model"] == model
    assert raw.headers["x-millm-steering"] == "none"
    assert raw.headers["x-millm-seed"].startswith("7")
    assert "metadata" in raw.headers["x-millm-ignored-fields"]
    assert raw.parse().content[0].text == "Hi"
    schema = {"type": "object", "properties": {"sunny": {"type": "boolean"}}, "required": ["sunny"]}
    constrained = client.messages.with_raw_response.create(
        model=model,
        max_tokens=20,
        messages=QUESTION,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert constrained.headers["x-millm-constrained"].startswith("json_schema")
    with pytest.raises(anthropic.BadRequestError) as caught:  # strict mode refuses what is not used
        client.messages.create(
            model=model,
            max_tokens=4,
            messages=[{"role": "user", "content": "hi"}],
            metadata={"user_id": "u-1"},
            extra_headers={"X-miLLM-Strict": "true"},
        )
    assert caught.value.body["error"]["param"] == "metadata"


def _refusal(response, status: int, kind: str = "invalid_request_error") -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and isinstance(body["error"]["message"], str)
    return body["error"]


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"stop_sequences": "."}, "stop_sequences"),
        ({"system": 3}, "system"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "system", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"top_k": 40}, "top_k"),
        ({"thinking": {"type": "enabled", "budget_tokens": "many"}}, "thinking.budget_tokens"),
        ({"stop": ["."]}, "stop"),
        ({"stop_sequences": ["."] * 17}, "stop_sequences"),
        ({"model": "\ud800" * 3}, "model"),
        ({"messages": [{"role": "x" * 100_000, "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "\u0000" * 1000}]}]}, "messages[0].content[0].type"),
    ],
)
def test_bad_bodies_are_refused_in_anthropics_shape(http, model, change, param):
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **change}
    body = {key: value for key, value in body.items() if value is not None}
    payload = json.dumps(body, ensure_ascii=True).encode()  # a lone surrogate goes as its escape
    response = http.post("/v1/messages", content=payload, headers={"Content-Type": "application/json"})
    error = _refusal(response, 400)
    assert error["param"] == param
    assert len(error["message"]) < 2000  # a hostile string is not echoed back whole


def test_broken_requests_are_refused_in_anthropics_shape(http, model):
    _refusal(http.post("/v1/messages", content=b"{not json", headers={"Content-Type": "application/json"}), 400)
    _refusal(http.post("/v1/messages", content=b"[1, 2]", headers={"Content-Type": "application/json"}), 400)
    _refusal(http.post("/v1/messages", content=b"hi", headers={"Content-Type": "text/plain"}), 415)
    deep: dict = {}
    for _ in range(200):
        deep = {"a": deep}
    _refusal(http.post("/v1/messages", json={"model": model, "max_tokens": 4, "messages": QUESTION, "x": deep}), 400)
    _refusal(http.post("/v1/messages/count_tokens", json={"model": model}), 400)
    _refusal(http.get("/v1/messages"), 405)
    _refusal(
        http.post("/v1/messages", json={"model": "nope", "max_tokens": 4, "messages": QUESTION}), 404, "not_found_error"
    )
    # the server keeps serving
    assert http.post("/v1/messages/count_tokens", json={"model": model, "messages": QUESTION}).status_code == 200


def test_sdk_errors_carry_anthropics_shape(client, model):
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=4, messages=QUESTION)
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=model, max_tokens=4, messages=QUESTION, extra_body={"temperature": 3})
    assert bad.value.body["error"]["param"] == "temperature"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.count_tokens(model=model, messages=[{"role": "user", "content": [{"type": "image"}]}])
    assert bad.value.body["type"] == "error"
