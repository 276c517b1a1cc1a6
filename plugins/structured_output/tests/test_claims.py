"""Where response_format and tools are honoured, refused or reported, engine by engine.

This server has no GGUF engine, embeddings route or scoring service installed, so
these refusals are checked at the host's own field check and at the plugin's
``validate_request`` with a real request context.
"""

from __future__ import annotations

import pytest

from millm_host import default_fields
from millm_host.api import (
    LOGITS_PROCESSORS,
    EngineSpec,
    FieldNotHonoured,
    ModelDescriptor,
    RequestContext,
    Settings,
    validate,
)
from millm_host.fields import FieldRegistry, check_fields
from millm_host.protocol import ChatCompletionRequest
from millm_structured_output import plugin
from millm_structured_output.errors import ResponseFormatUnsupported

from .family import WEATHER_TOOL

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
HISTORY = [
    {"role": "user", "content": "hi"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]


#: Stand-ins for the two engines: only the first applies logits processors.
ENGINES = [
    EngineSpec("transformers", "x:X", "x:describe", frozenset({"hf"}), capabilities=frozenset({LOGITS_PROCESSORS})),
    EngineSpec("gguf", "x:X", "x:describe", frozenset({"gguf"})),
]


@pytest.fixture(scope="module")
def fields() -> FieldRegistry:
    registry = FieldRegistry(ENGINES)
    default_fields.register_request_fields(registry.register)
    plugin.register_request_fields(registry.register)
    return registry


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [WEATHER_TOOL]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ],
)
def test_gguf_refuses_before_loading(fields, extra, param):
    with pytest.raises(FieldNotHonoured) as raised:
        check_fields(fields, "chat.completions", "gguf", {**CHAT, **extra}, strict=False)
    assert raised.value.param == param


def test_embeddings_refuse_response_format(fields):
    with pytest.raises(FieldNotHonoured):
        check_fields(
            fields, "embeddings", "transformers", {"model": "m", "response_format": {"type": "json_object"}}, False
        )


def test_no_change_values_pass_everywhere(fields):
    body = {
        **CHAT,
        "response_format": {"type": "text"},
        "tools": [],
        "tool_choice": "none",
        "parallel_tool_calls": True,
    }
    assert check_fields(fields, "chat.completions", "gguf", body, strict=False) == []


def test_gguf_reports_tool_history(fields):
    unused = check_fields(fields, "chat.completions", "gguf", {**CHAT, "messages": HISTORY}, strict=False)
    assert unused == ["messages[1].tool_calls", "messages[2].tool_call_id"]


def test_transformers_honours_everything(fields):
    body = {**CHAT, "messages": HISTORY, "tools": [WEATHER_TOOL], "tool_choice": "auto", "parallel_tool_calls": False}
    assert check_fields(fields, "chat.completions", "transformers", body, strict=True) == []
    schema_body = {
        **CHAT,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "n", "description": "d", "strict": True, "schema": {"type": "object"}},
        },
    }
    assert check_fields(fields, "chat.completions", "transformers", schema_body, strict=True) == []


def test_tool_strict_is_honoured_where_tools_are(fields):
    """Every call is held to its function's parameters by a grammar, so strict is claimed, not reported."""
    tool = {"type": "function", "function": {**WEATHER_TOOL["function"], "strict": True}}
    body = {**CHAT, "tools": [tool]}
    assert check_fields(fields, "chat.completions", "transformers", body, strict=True) == []
    with pytest.raises(FieldNotHonoured) as raised:
        check_fields(fields, "chat.completions", "gguf", body, strict=False)
    assert raised.value.param == "tools"


def context(body: dict, *, scoring: bool) -> RequestContext:
    ctx = RequestContext(
        endpoint="chat.completions",
        body=body,
        params=validate(ChatCompletionRequest, body),
        headers={},
        model=ModelDescriptor(id="m", path="/nowhere", format="hf", engine="transformers"),
        engine_name="transformers",
        settings=Settings(environ={}),
        scoring=scoring,
        engine_capabilities=frozenset({LOGITS_PROCESSORS}),
    )
    ctx.conversations = [[{"role": m["role"], "content": m["content"]} for m in body["messages"]]]
    ctx.messages = [list(body["messages"])]
    return ctx


def test_scoring_requests_refuse_both():
    scoring = {**CHAT, "logprobs": True, "max_tokens": 1}
    with pytest.raises(ResponseFormatUnsupported) as raised:
        plugin.validate_request(context({**scoring, "response_format": {"type": "json_object"}}, scoring=True))
    assert raised.value.param == "response_format"
    with pytest.raises(FieldNotHonoured) as raised:
        plugin.validate_request(context({**scoring, "tools": [WEATHER_TOOL]}, scoring=True))
    assert raised.value.param == "tools"


def test_a_request_without_either_installs_nothing():
    ctx = context(dict(CHAT), scoring=False)
    plugin.validate_request(ctx)
    assert plugin.NAME not in ctx.state and plugin.before_forward(ctx) is None


def test_tool_history_comes_from_the_full_messages_not_the_body():
    """The host keeps each conversation's messages in full (ctx.messages); the body is never reread."""
    ctx = context({**CHAT, "messages": HISTORY}, scoring=False)
    ctx.body = dict(CHAT)  # what the body says no longer matters
    plugin.validate_request(ctx)
    assert ctx.state[plugin.NAME].history == ["messages[1].tool_calls"]
    assert ctx.conversations[0][1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {}}
    assert ctx.conversations[0][2]["tool_call_id"] == "c1"
