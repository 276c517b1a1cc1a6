"""Function calling through a real server: each family's template, its call format, streaming.

The tiny models write what ``X-Test-Scripted-Output`` scripts, so each test
knows the reply and checks what the server makes of it. Expected prompts are
rendered independently with transformers' own ``apply_chat_template``.
"""

from __future__ import annotations

import json

import httpx
import pytest
import transformers

from millm_host.testing import assert_error
from millm_host.testing.sse import sse_events

from .family import TIME_TOOL, WEATHER_TOOL, scripted

QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
LFM2_CALL = '<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>'


@pytest.fixture(scope="module")
def http(family_server):
    with family_server.http() as client:
        yield client


@pytest.fixture(scope="module")
def tokenizers(family_models):
    cache: dict[str, transformers.PreTrainedTokenizerBase] = {}

    def get(model: str):
        if model not in cache:
            cache[model] = transformers.AutoTokenizer.from_pretrained(family_models / model)
        return cache[model]

    return get


def expected_prompt_tokens(tokenizer, messages, tools=None) -> int:
    """Tokens of the prompt as the spec says a chat becomes ids (one BOS), computed with transformers."""
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    add_special = not (tokenizer.bos_token and text.startswith(tokenizer.bos_token))
    return len(tokenizer(text, add_special_tokens=add_special)["input_ids"])


def ask(http, model, reply: str, *, messages=QUESTION, **extra) -> httpx.Response:
    body = {"model": model, "messages": messages, "tools": [WEATHER_TOOL, TIME_TOOL], "max_tokens": 80, **extra}
    return http.post("/v1/chat/completions", json=body, headers=scripted(reply))


def only_choice(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def assert_weather_call(choice, content=None):
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == content
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def sse_chunks(http, body: dict, headers: dict) -> list[dict]:
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}, headers=headers) as response:
        assert response.status_code == 200
        return sse_events(response)


# --- Hermes / Qwen2.5 ----------------------------------------------------------------


def test_hermes_call_is_parsed(http):
    assert_weather_call(only_choice(ask(http, "tiny-qwen25", HERMES_CALL)))


def test_hermes_text_before_the_call_stays_content(http):
    assert_weather_call(only_choice(ask(http, "tiny-qwen25", "Let me look.\n" + HERMES_CALL)), "Let me look.\n")


def test_hermes_stream_sends_content_then_the_call_name_then_its_arguments(http):
    body = {"model": "tiny-qwen25", "messages": QUESTION, "tools": [WEATHER_TOOL], "max_tokens": 80}
    chunks = sse_chunks(http, body, scripted("Checking. " + HERMES_CALL))
    assert chunks[-1] == "[DONE]"
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1] if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    content = "".join(d.get("content") or "" for d in deltas)
    assert content == "Checking. "
    call_deltas = [d for d in deltas if "tool_calls" in d]
    assert len(call_deltas) > 2  # under the grammar, the arguments go out as they are written
    (opening,) = call_deltas[0]["tool_calls"]
    assert opening["index"] == 0 and opening["id"].startswith("call_") and opening["type"] == "function"
    assert opening["function"] == {"name": "get_weather", "arguments": ""}
    pieces = [part for d in call_deltas[1:] for part in d["tool_calls"]]
    assert all(set(part) == {"index", "function"} and part["index"] == 0 for part in pieces)
    assert "".join(part["function"]["arguments"] for part in pieces) == '{"city": "Paris"}'
    finals = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"]]
    assert finals[-1] == "tool_calls" and all(f is None for f in finals[:-1])
    choice_chunks = [c for c in chunks[:-1] if c["choices"]]  # extension chunks (choices: []) end a stream
    kinds = ["call" if "tool_calls" in c["choices"][0]["delta"] else "other" for c in choice_chunks]
    first_call = kinds.index("call")
    assert kinds[first_call:-1] == ["call"] * (len(kinds) - 1 - first_call)  # content first, then only the call


def test_sdk_stream_helper_runs_to_completion(family_server):
    client = family_server.openai()
    with client.chat.completions.stream(
        model="tiny-qwen25",
        messages=QUESTION,
        tools=[WEATHER_TOOL, TIME_TOOL],
        max_tokens=80,
        extra_headers=scripted("One moment. " + HERMES_CALL),
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "content.done" in kinds and "tool_calls.function.arguments.done" in kinds
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "One moment. "
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


def test_sdk_non_streaming_client(family_server):
    completion = family_server.openai().chat.completions.create(
        model="tiny-qwen25", messages=QUESTION, tools=[WEATHER_TOOL], max_tokens=80, extra_headers=scripted(HERMES_CALL)
    )
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "tool_calls" and message.content is None
    assert message.tool_calls[0].function.name == "get_weather"


def test_parallel_calls_and_parallel_false(http):
    two = HERMES_CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>'
    both = only_choice(ask(http, "tiny-qwen25", two))["message"]["tool_calls"]
    assert [c["function"]["name"] for c in both] == ["get_weather", "get_time"]
    assert len({c["id"] for c in both}) == 2
    one = only_choice(ask(http, "tiny-qwen25", two, parallel_tool_calls=False))["message"]["tool_calls"]
    assert [c["function"]["name"] for c in one] == ["get_weather"]


def test_a_reply_in_words_is_plain_content(http):
    """A call to a function not offered, or a malformed one, cannot be written: the grammar
    allows only calls held to the schema (``test_tool_grammar``)."""
    choice = only_choice(ask(http, "tiny-qwen25", "It is sunny in Paris."))
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == "It is sunny in Paris." and "tool_calls" not in choice["message"]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_is_forced_by_the_grammar_not_the_prompt(http, tokenizers, tool_choice):
    response = ask(http, "tiny-qwen25", HERMES_CALL, tool_choice=tool_choice)
    assert_weather_call(only_choice(response))
    expected = expected_prompt_tokens(tokenizers("tiny-qwen25"), QUESTION, [WEATHER_TOOL, TIME_TOOL])
    assert response.json()["usage"]["prompt_tokens"] == expected


def test_tool_choice_none_shows_no_tools_and_parses_nothing(http, tokenizers):
    choice = ask(http, "tiny-qwen25", HERMES_CALL, tool_choice="none")
    assert only_choice(choice)["message"]["content"] == HERMES_CALL
    assert choice.json()["usage"]["prompt_tokens"] == expected_prompt_tokens(tokenizers("tiny-qwen25"), QUESTION)


HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
]
HISTORY_AS_TEMPLATE_SEES_IT = [
    HISTORY[0],
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    },
    HISTORY[2],
]


@pytest.mark.parametrize("model", ["tiny-qwen25", "tiny-llama31"])
def test_history_is_rendered_by_the_template(http, tokenizers, model):
    response = ask(http, model, "It is sunny.", messages=HISTORY)
    choice = only_choice(response)
    assert choice["message"]["content"] == "It is sunny."
    assert "x-millm-ignored-fields" not in response.headers
    expected = expected_prompt_tokens(tokenizers(model), HISTORY_AS_TEMPLATE_SEES_IT, [WEATHER_TOOL, TIME_TOOL])
    assert response.json()["usage"]["prompt_tokens"] == expected
    as_object = [HISTORY[0], HISTORY_AS_TEMPLATE_SEES_IT[1], HISTORY[2]]  # arguments sent as an object
    assert ask(http, model, "ok", messages=as_object).json()["usage"]["prompt_tokens"] == expected


# --- Llama 3.x JSON ---------------------------------------------------------------------


def test_llama_whole_reply_call(http):
    assert_weather_call(only_choice(ask(http, "tiny-llama31", LLAMA_CALL)))


def test_llama_plain_reply_and_json_that_is_not_a_call(http):
    for reply in ["Paris is sunny.", '{"city": "Paris"}']:
        choice = only_choice(ask(http, "tiny-llama31", reply))
        assert choice["message"]["content"] == reply and choice["finish_reason"] == "stop"


def test_llama_named_choice_and_stream(http, tokenizers):
    forced = {"type": "function", "function": {"name": "get_weather"}}
    body = {
        "model": "tiny-llama31",
        "messages": QUESTION,
        "tools": [WEATHER_TOOL],
        "max_tokens": 40,
        "tool_choice": forced,
    }
    chunks = sse_chunks(http, body, scripted(LLAMA_CALL))
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1] if c["choices"]]
    assert not any(d.get("content") for d in deltas)
    (call,) = next(d for d in deltas if "tool_calls" in d)["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert [c for c in chunks[:-1] if c["choices"]][-1]["choices"][0]["finish_reason"] == "tool_calls"


# --- LFM2 pythonic ------------------------------------------------------------------------


@pytest.mark.parametrize("reply", [LFM2_CALL, "[get_weather(city='Paris')]"])
def test_lfm2_calls(http, reply):
    assert_weather_call(only_choice(ask(http, "tiny-lfm2", reply)))


def test_lfm2_text_after_the_call_is_content(http):
    choice = only_choice(ask(http, "tiny-lfm2", LFM2_CALL + "Checking the weather."))
    assert_weather_call(choice, "Checking the weather.")


def test_lfm2_history_is_written_in_its_syntax(http, tokenizers):
    """LFM2's template renders only content: the call goes there, as the model writes it."""
    response = ask(http, "tiny-lfm2", "Sunny.", messages=HISTORY)
    assert only_choice(response)["message"]["content"] == "Sunny."
    as_lfm2_writes_it = [HISTORY[0], {"role": "assistant", "content": LFM2_CALL}, HISTORY[2]]
    expected = expected_prompt_tokens(tokenizers("tiny-lfm2"), as_lfm2_writes_it, [WEATHER_TOOL, TIME_TOOL])
    assert response.json()["usage"]["prompt_tokens"] == expected


def test_lfm2_required_and_stream_helper(family_server):
    client = family_server.openai()
    with client.chat.completions.stream(
        model="tiny-lfm2",
        messages=QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=40,
        extra_headers=scripted(LFM2_CALL),
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.choices[0].message.tool_calls[0].function.name == "get_weather"


# --- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, param",
    [
        (
            {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
            "tool_choice.function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER_TOOL], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ],
)
def test_invalid_tool_requests(http, extra, param):
    body = {"model": "tiny-qwen25", "messages": QUESTION, "max_tokens": 4, **extra}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_completions_refuse_tools(http):
    body = {"model": "tiny-qwen25", "prompt": "x", "max_tokens": 2, "tools": [WEATHER_TOOL]}
    assert_error(http.post("/v1/completions", json=body), 400, "field_not_honoured", "tools")


def test_a_template_refusing_the_history_is_a_400(http):
    """Llama 3.1's template takes one call per assistant turn and says so with raise_exception."""
    two_calls = [
        HISTORY[0],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [HISTORY[1]["tool_calls"][0], {**HISTORY[1]["tool_calls"][0], "id": "call_2"}],
        },
        HISTORY[2],
    ]
    response = http.post("/v1/chat/completions", json={"model": "tiny-llama31", "messages": two_calls, "max_tokens": 4})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages" and "single tool-calls" in error["message"]
    assert (
        http.post(
            "/v1/chat/completions", json={"model": "tiny-llama31", "messages": QUESTION, "max_tokens": 2}
        ).status_code
        == 200
    )
