"""Tool-call history: carried into the rendered conversations for the chat template.

The host renders role and text content only. Here an assistant message's
``tool_calls`` (arguments as the object templates expect, from the JSON string
OpenAI clients send) and a tool message's ``tool_call_id`` are added to the
conversation the template sees. A template that does not render ``tool_calls``
itself (LFM2's writes only content) gets the calls written into the content in
its family's own syntax.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from millm_host.api import InvalidParameter

from .formats import CallFormat, ParsedCall


def sources(messages: list[list[dict[str, Any]]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """``(location, messages)`` of every conversation (``ctx.messages``), in ``ctx.conversations`` order."""
    for i, rows in enumerate(messages):
        yield ("messages" if i == 0 else f"extra_messages[{i - 1}]"), rows


def add_tool_history(messages: list[list[dict[str, Any]]], conversations: list[list[dict[str, Any]]]) -> list[str]:
    """Copy tool calls and tool-call ids from the full ``messages`` (``ctx.messages``) into
    ``conversations``; return where calls were found."""
    found: list[str] = []
    for conversation, (where, rows) in zip(conversations, sources(messages), strict=False):
        for j, (message, rendered) in enumerate(zip(rows, conversation, strict=False)):
            if not isinstance(message, dict):
                continue
            here = f"{where}[{j}]"
            calls = message.get("tool_calls")
            if calls is not None and calls != []:
                if message.get("role") != "assistant":
                    raise InvalidParameter("only assistant messages carry tool_calls", param=f"{here}.tool_calls")
                rendered["tool_calls"] = [
                    _call(call, f"{here}.tool_calls[{k}]") for k, call in enumerate(_list(calls, here))
                ]
                found.append(f"{here}.tool_calls")
            call_id = message.get("tool_call_id")
            if call_id is not None:
                if not isinstance(call_id, str):
                    raise InvalidParameter("tool_call_id must be a string", param=f"{here}.tool_call_id")
                rendered["tool_call_id"] = call_id
    return found


def _list(calls: Any, here: str) -> list[Any]:
    if not isinstance(calls, list):
        raise InvalidParameter("tool_calls must be an array", param=f"{here}.tool_calls")
    return calls


def _call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidParameter("a tool call needs function.name", param=f"{where}.function.name")
    if call.get("type", "function") != "function":
        raise InvalidParameter('a tool call\'s type must be "function"', param=f"{where}.type")
    if call.get("id") is not None and not isinstance(call["id"], str):
        raise InvalidParameter("a tool call's id must be a string", param=f"{where}.id")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            parsed = None
        arguments = parsed if isinstance(parsed, dict) else arguments  # templates get an object when there is one
    elif not isinstance(arguments, dict):
        raise InvalidParameter(
            "function.arguments must be a JSON string or an object", param=f"{where}.function.arguments"
        )
    rendered: dict[str, Any] = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if call.get("id") is not None:
        rendered["id"] = call["id"]
    return rendered


def write_calls_into_content(
    conversations: list[list[dict[str, Any]]], fmt: CallFormat, messages: list[list[dict[str, Any]]]
) -> None:
    """For a template that renders only content: calls become text in the family's syntax."""
    for conversation, (where, _) in zip(conversations, sources(messages), strict=False):
        for j, message in enumerate(conversation):
            calls = message.pop("tool_calls", None)
            if not calls:
                continue
            parsed = []
            for k, call in enumerate(calls):
                arguments = call["function"]["arguments"]
                if not isinstance(arguments, dict):
                    raise InvalidParameter(
                        "this model writes calls with keyword arguments: function.arguments must be a JSON object",
                        param=f"{where}[{j}].tool_calls[{k}].function.arguments",
                    )
                parsed.append(ParsedCall(call["function"]["name"], arguments))
            message["content"] = fmt.render(parsed) + (message.get("content") or "")
