"""The generic tool-call format: tools on a model whose template shows none (SmolLM2's, or no template).

Logic first (the reply schema, parsing, the streaming filter, history), then
the in-process app with scripted replies (what the server makes of a known
reply, what the prompt holds), then a real ``millm serve`` on a tiny random
model with SmolLM2's template through the openai SDK, where only the
constraint makes the junk it writes a valid call.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import transformers

from millm_structured_output.grammar_schema import grammar_schema
from millm_structured_output.tools.generic import (
    describe_tools,
    parse_reply,
    reply_schema,
    show_tools,
    write_generic_history,
)
from millm_structured_output.tools.generic_filter import GenericToolFilter
from millm_structured_output.tools.request import parse_tool_request

from .family import TIME_TOOL, WEATHER_TOOL, scripted

QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER_TOOL, TIME_TOOL)}
#: What pydantic writes for a nested model: a local $ref into $defs, no additionalProperties.
PYDANTIC_TOOL = {
    "type": "function",
    "function": {
        "name": "book",
        "parameters": {
            "$defs": {
                "Place": {
                    "properties": {"city": {"title": "City", "type": "string"}},
                    "required": ["city"],
                    "title": "Place",
                    "type": "object",
                }
            },
            "properties": {"where": {"$ref": "#/$defs/Place"}, "nights": {"type": "integer", "exclusiveMinimum": 0}},
            "required": ["where", "nights"],
            "title": "book",
            "type": "object",
        },
    },
}


def request(**body):
    return parse_tool_request({"tools": [WEATHER_TOOL, TIME_TOOL], **body})


def matcher(schema):
    from millm_host.testing.tiny_models import smollm2_tokenizer_dir

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    import llguidance.hf

    grammar = llguidance.LLMatcher.grammar_from_json_schema(grammar_schema(schema))  # as the plugin compiles it
    return tokenizer, llguidance.LLMatcher(llguidance.hf.from_tokenizer(tokenizer), grammar)


def accepts(schema, text: str) -> bool:
    tokenizer, m = matcher(schema)
    return m.consume_tokens(tokenizer.encode(text)) and m.is_accepting()


# --- the reply schema ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, good, bad",
    [
        (
            {},
            ['{"response": "Sunny."}', '{"tool_calls": [{"name": "get_time", "arguments": {"city": "Oslo"}}]}'],
            ['{"tool_calls": []}', '{"tool_call": {"name": "get_time", "arguments": {"city": "Oslo"}}}'],
        ),
        (
            {"tool_choice": "required", "parallel_tool_calls": False},
            ['{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'],
            ['{"response": "Sunny."}', '{"tool_call": {"name": "get_weather", "arguments": {}}}'],
        ),
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_time"}}},  # a named function: one call
            ['{"tool_call": {"name": "get_time", "arguments": {"city": "Oslo"}}}'],
            [
                '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}',
                '{"tool_call": {"name": "get_time", "arguments": {"city": "Oslo", "tz": "x"}}}',  # no padding keys
                '{"tool_calls": [{"name": "get_time", "arguments": {"city": "Oslo"}}]}',
            ],
        ),
    ],
)
def test_reply_schema_allows_exactly_the_shapes_asked_for(body, good, bad):
    schema = reply_schema(request(**body))
    assert all(accepts(schema, text) for text in good)
    assert not any(accepts(schema, text) for text in bad)


def test_pydantic_parameters_keep_their_refs_and_are_closed():
    schema = reply_schema(parse_tool_request({"tools": [PYDANTIC_TOOL], "tool_choice": "required"}))
    assert accepts(schema, '{"tool_calls": [{"name": "book", "arguments": {"where": {"city": "Rome"}, "nights": 2}}]}')
    assert not accepts(
        schema, '{"tool_calls": [{"name": "book", "arguments": {"where": {"city": "Rome", "x": 1}, "nights": 2}}]}'
    )
    assert not accepts(
        schema, '{"tool_calls": [{"name": "book", "arguments": {"where": {"city": "Rome"}, "nights": 0}}]}'
    )


def test_a_property_named_properties_is_not_taken_for_a_keyword():
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"properties": {"type": "string"}},
                "required": ["properties"],
            },
        },
    }
    defs = grammar_schema(reply_schema(parse_tool_request({"tools": [tool]})))["$defs"]["tool_0"]
    assert defs["properties"] == {"properties": {"type": "string"}} and defs["additionalProperties"] is False


def test_a_function_without_parameters_takes_an_empty_object():
    tool = {"type": "function", "function": {"name": "ping"}}
    schema = reply_schema(parse_tool_request({"tools": [tool], "tool_choice": "required"}))
    assert accepts(schema, '{"tool_calls": [{"name": "ping", "arguments": {}}]}')
    assert not accepts(schema, '{"tool_calls": [{"name": "ping", "arguments": {"a": 1}}]}')


def test_the_prompt_describes_tools_and_the_shape_for_the_choice():
    auto = describe_tools(request())
    assert '"name": "get_weather"' in auto and '"description": "Current weather in a city"' in auto
    assert '{"tool_calls": [' in auto and '{"response": ' in auto
    named = describe_tools(request(tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert "Call the tool get_time" in named and '"response"' not in named
    single = describe_tools(request(tool_choice="required", parallel_tool_calls=False))
    assert '{"tool_call": {"name": "<tool name>"' in single


def test_tools_join_the_system_message_or_open_one():
    with_system = [{"role": "system", "content": "Be brief."}, *QUESTION]
    show_tools(with_system, "TOOLS", "{{ 'system' }}")
    assert with_system[0] == {"role": "system", "content": "Be brief.\n\nTOOLS"}
    plain = [*QUESTION]
    show_tools(plain, "TOOLS", None)
    assert plain[0] == {"role": "system", "content": "TOOLS"} and plain[1] == QUESTION[0]
    no_system_role = [dict(QUESTION[0])]
    show_tools(no_system_role, "TOOLS", "{{ messages }}")
    assert no_system_role == [{"role": "user", "content": "TOOLS\n\nWeather in Paris?"}]


# --- parsing and the streaming filter ---------------------------------------------------------


def test_parse_reply_reads_each_shape_and_nothing_else():
    assert parse_reply('{"response": "hi"}').response == "hi"
    (call,) = parse_reply('{"tool_call": {"name": "f", "arguments": {"a": 1}}}').calls
    assert (call.name, call.arguments) == ("f", {"a": 1})
    assert (
        len(parse_reply('{"tool_calls": [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]}').calls) == 2
    )
    for text in ['{"response": "hi", "x": 1}', '{"tool_calls": []}', "[1]", '{"tool_calls": [{"name": "f"', "hi"]:
        assert parse_reply(text) is None


def feed_all(reply: str, names=("get_weather",), parallel=True, finish="stop"):
    """Feed ``reply`` a character at a time (escapes split across feeds); the text sent, and the end."""
    fil = GenericToolFilter(frozenset(names), parallel)
    sent = [fil.feed(ch) for ch in reply]
    return sent, fil.finish(finish)


def test_an_answer_streams_as_its_text_while_it_is_written():
    sent, end = feed_all('{"response": "He said \\"hi\\"\\n\\u00e9 \\ud83d\\ude00."}')
    assert "".join(sent) + end.text == 'He said "hi"\n\u00e9 \U0001f600.'
    assert sent.index("H") == len('{"response": "')  # the first character goes as soon as it is written
    assert end.finish_reason is None and "tool_calls" not in end.message_extras


def test_a_call_is_held_then_sent_as_tool_calls():
    sent, end = feed_all('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}')
    assert not any(sent)
    assert end.finish_reason == "tool_calls" and end.message_extras["content"] is None
    (call,) = end.message_extras["tool_calls"]
    assert call["id"].startswith("call_") and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_a_call_streams_its_name_then_its_arguments_as_they_are_written():
    fil = GenericToolFilter(frozenset(["get_weather", "get_time"]), True)
    reply = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]}'
    deltas = []
    for ch in reply:
        assert fil.feed(ch) == ""
        deltas.append(fil.take_deltas())
    end = fil.finish("stop")
    deltas.append(fil.take_deltas())
    parts = [part for batch in deltas for delta in batch for part in delta["tool_calls"]]
    assert parts[0] == {
        "index": 0,
        "id": end.message_extras["tool_calls"][0]["id"],
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    first_arguments = [p["function"]["arguments"] for p in parts if p["index"] == 0 and "id" not in p]
    assert len(first_arguments) == len('{"city": "Paris"}')  # a character at a time, as fed
    assert "".join(first_arguments) == end.message_extras["tool_calls"][0]["function"]["arguments"]
    assert [c["function"]["name"] for c in end.message_extras["tool_calls"]] == ["get_weather", "get_time"]
    assert end.message_extras["tool_calls"][1]["function"]["arguments"] == "{}"


def test_parallel_false_keeps_the_first_call():
    two = '{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]}'
    _, end = feed_all(two, names=("a", "b"), parallel=False)
    assert [c["function"]["name"] for c in end.message_extras["tool_calls"]] == ["a"]


@pytest.mark.parametrize(
    "reply, content",
    [
        ('{"tool_calls": [{"name": "get_weather", "arguments": {"ci', ""),  # a cut call is never content
        ('{"tool_c', ""),
        ('{"response": "Sunny and wa', "Sunny and wa"),
    ],
)
def test_a_cut_reply_is_its_text_and_a_cut_call_is_dropped(reply, content):
    sent, end = feed_all(reply, finish="length")
    assert "".join(sent) + end.text == content and end.finish_reason is None and not end.message_extras


def test_a_cut_second_call_is_dropped_and_the_first_kept():
    reply = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "argu'
    sent, end = feed_all(reply, finish="length")
    assert not any(sent) and end.text == "" and end.finish_reason == "length"
    (call,) = end.message_extras["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"} and end.message_extras["content"] is None


def test_an_unoffered_call_is_content():
    reply = '{"tool_calls": [{"name": "other", "arguments": {}}]}'
    sent, end = feed_all(reply)
    assert "".join(sent) + end.text == reply and end.finish_reason is None


def test_with_a_response_format_the_document_is_content_streamed_and_a_call_still_a_call():
    fil = GenericToolFilter(frozenset(["get_weather"]), True, document=True)
    document = '{"label": "humor"}'
    sent = [fil.feed(ch) for ch in document]
    assert sent[:1] == [""] and "".join(sent) == document[: len("".join(sent))] and sent[-1] == "}"
    end = fil.finish("stop")
    assert "".join(sent) + end.text == document and end.finish_reason is None

    fil = GenericToolFilter(frozenset(["get_weather"]), True, document=True)
    call = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
    assert not any(fil.feed(ch) for ch in call)
    assert fil.finish("stop").finish_reason == "tool_calls"


def test_history_is_written_in_the_generic_shapes():
    conversation = [
        QUESTION[0],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": "18 C", "tool_call_id": "call_1"},
    ]
    write_generic_history([conversation], parallel=True)
    assert conversation[1] == {
        "role": "assistant",
        "content": '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}',
    }
    assert conversation[2] == {
        "role": "user",
        "content": '{"tool_response": {"tool_call_id": "call_1", "name": "get_weather", "content": "18 C"}}',
    }


# --- the in-process app, scripted replies ----------------------------------------------------


@pytest.fixture(scope="module")
def http(family_server):
    with family_server.http() as client:
        yield client


@pytest.fixture(scope="module")
def smollm2(family_models):
    return transformers.AutoTokenizer.from_pretrained(family_models / "tiny-smollm2")


def prompt_tokens(tokenizer, messages) -> int:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def post(http, reply: str | None, model="tiny-smollm2", **body):
    full = {"model": model, "messages": QUESTION, "tools": [WEATHER_TOOL, TIME_TOOL], "max_tokens": 60, **body}
    response = http.post("/v1/chat/completions", json=full, headers=scripted(reply) if reply is not None else {})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_scripted_call_comes_back_as_tool_calls(http, smollm2):
    body = post(http, '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}')
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    system = {"role": "system", "content": describe_tools(request())}
    assert body["usage"]["prompt_tokens"] == prompt_tokens(smollm2, [system, *QUESTION])


def test_a_scripted_answer_is_plain_content_streamed(http):
    body = {"model": "tiny-smollm2", "messages": QUESTION, "tools": [WEATHER_TOOL], "max_tokens": 60, "stream": True}
    headers = scripted('{"response": "It is \\"sunny\\" \\u2600"}')
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        from millm_host.testing.sse import sse_events

        events = sse_events(response)
    deltas = [e["choices"][0] for e in events[:-1] if isinstance(e, dict) and e.get("choices")]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == 'It is "sunny" \u2600'
    assert len([d for d in deltas if d["delta"].get("content")]) > 1  # streamed, not sent at the end
    assert deltas[-1]["finish_reason"] == "stop" and not any("tool_calls" in d["delta"] for d in deltas)


def test_tool_choice_none_shows_no_tools(http, smollm2):
    body = post(http, "Plain words.", tool_choice="none")
    assert body["choices"][0]["message"]["content"] == "Plain words."
    assert body["usage"]["prompt_tokens"] == prompt_tokens(smollm2, QUESTION)


def test_history_reaches_the_template_in_the_generic_shapes(http, smollm2):
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_7",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_7", "content": "18 C, sunny"},
    ]
    body = post(http, '{"response": "Sunny."}', messages=history)
    assert body["choices"][0]["message"]["content"] == "Sunny."
    expected = [
        {"role": "system", "content": describe_tools(request())},
        QUESTION[0],
        {"role": "assistant", "content": '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'},
        {
            "role": "user",
            "content": '{"tool_response": {"tool_call_id": "call_7", "name": "get_weather", "content": "18 C, sunny"}}',
        },
    ]
    assert body["usage"]["prompt_tokens"] == prompt_tokens(smollm2, expected)
    no_tools = http.post(
        "/v1/chat/completions", json={"model": "tiny-smollm2", "messages": history, "max_tokens": 4}
    )  # history alone: rendered the same way, no tools shown
    assert no_tools.status_code == 200, no_tools.text
    assert no_tools.json()["usage"]["prompt_tokens"] == prompt_tokens(smollm2, expected[1:])


@pytest.mark.parametrize("model", ["tiny-no-template", "tiny-unknown-calls"])
def test_other_templates_without_a_readable_format_use_it_too(http, model):
    choice = post(http, None, model=model, tool_choice="required", max_tokens=120)["choices"][0]
    if choice["finish_reason"] == "tool_calls":
        for call in choice["message"]["tool_calls"]:
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    else:  # a random model may run out of tokens inside a string
        assert choice["finish_reason"] == "length"


def test_native_families_keep_their_format(http):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    choice = post(http, call, model="tiny-qwen25")["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


# --- a real server on a tiny random model, through the openai SDK ---------------------------------


#: Bounded arguments: a random model's strings stop within max_tokens, so a forced call always completes.
SHORT_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
        },
    },
}
SHORT_TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]},
    },
}
SHORT_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (SHORT_WEATHER, SHORT_TIME)}


@pytest.fixture(scope="module")
def client(tiny_server):
    return tiny_server.openai()


def create(client, model, **body):
    body = {"messages": QUESTION, "tools": [SHORT_WEATHER, SHORT_TIME], "max_tokens": 200, "temperature": 0.0, **body}
    return client.chat.completions.create(model=model, **body)


def assert_valid_calls(message, names=("get_weather", "get_time")):
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function" and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SHORT_SCHEMAS[call.function.name])
    assert len({call.id for call in message.tool_calls}) == len(message.tool_calls)


@pytest.mark.parametrize("seed", [0, 1])
def test_required_always_parses_as_a_call(client, tiny_server, seed):
    completion = create(client, tiny_server.model_id, tool_choice="required", temperature=1.0, seed=seed)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice.message.content
    assert_valid_calls(choice.message)


def test_named_calls_only_that_function_and_parallel_false_calls_once(client, tiny_server):
    named = {"type": "function", "function": {"name": "get_time"}}
    completion = create(client, tiny_server.model_id, tool_choice=named, parallel_tool_calls=False)
    assert completion.choices[0].finish_reason == "tool_calls"
    assert len(completion.choices[0].message.tool_calls) == 1
    assert_valid_calls(completion.choices[0].message, names=("get_time",))


def test_auto_is_a_call_or_an_answer(client, tiny_server):
    for seed in range(3):
        choice = create(client, tiny_server.model_id, temperature=1.0, seed=seed).choices[0]
        if choice.finish_reason == "tool_calls":
            assert_valid_calls(choice.message)
        else:
            assert isinstance(choice.message.content, str) and not choice.message.tool_calls


def test_none_is_plain_text(client, tiny_server):
    choice = create(client, tiny_server.model_id, tool_choice="none", max_tokens=8).choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls


def test_required_streams_tool_call_deltas(client, tiny_server):
    stream = create(client, tiny_server.model_id, tool_choice="required", stream=True)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert not delta.content
        for part in delta.tool_calls or ():
            entry = calls.setdefault(part.index, {"id": part.id, "name": part.function.name, "arguments": ""})
            entry["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and calls
    for entry in calls.values():
        assert entry["id"].startswith("call_")
        jsonschema.validate(json.loads(entry["arguments"]), SHORT_SCHEMAS[entry["name"]])


def test_stream_helper_and_a_round_trip_with_the_tool_result(client, tiny_server):
    with client.chat.completions.stream(
        model=tiny_server.model_id,
        messages=QUESTION,
        tools=[SHORT_WEATHER],
        tool_choice="required",
        max_tokens=200,
        temperature=0.0,
    ) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert_valid_calls(message, names=("get_weather",))
    history = [
        *QUESTION,
        message.model_dump(exclude_none=True),
        *({"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"} for call in message.tool_calls),
    ]
    after = create(client, tiny_server.model_id, messages=history, tools=[SHORT_WEATHER], max_tokens=30)
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")
    if after.choices[0].finish_reason == "tool_calls":
        assert_valid_calls(after.choices[0].message, names=("get_weather",))


def test_max_tokens_cutting_the_only_call_drops_it(client, tiny_server):
    choice = create(client, tiny_server.model_id, tool_choice="required", max_tokens=5).choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert not choice.message.content  # never the call's raw JSON
