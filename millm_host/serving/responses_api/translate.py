"""A Responses body as the chat completion it asks for, and the field rules on what does not translate.

Every field is honoured, reported or refused, as on chat completions:

- honoured by translation: ``input`` (text, or message, ``function_call`` and
  ``function_call_output`` items; ``reasoning`` items, an earlier turn's thinking
  sent back, are accepted and left out, as chat templates leave it out), ``instructions`` (a system message first),
  ``max_output_tokens``, ``temperature``, ``top_p``, ``stream``, function
  ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``text.format``
  (``response_format``); ``metadata`` is echoed in the response object;
- refused where they would change the answer (``RESPONSES_REFUSED``):
  ``previous_response_id``, ``conversation``, ``prompt``, ``background: true``,
  ``reasoning``, ``include``, ``top_logprobs``, ``truncation: "auto"``, built-in
  tools, non-text inputs; and the chat names of Responses fields (``messages``,
  ``max_tokens``, ...), which would otherwise be served under the wrong name;
- reported (``X-miLLM-Ignored-Fields``; refused under ``X-miLLM-Strict``):
  ``store: true`` (nothing is stored), ``user``, ``service_tier``, ... and
  unknown keys inside input items, tools and ``text``.

Any other top-level field (``seed``, ``stop``, millm's ``profile``,
``steering``, ...) passes through to the chat completion, where the chat rules
honour, report or refuse it under the same name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...bodies.validate import validate
from ...errors import FieldNotHonoured, InvalidParameter
from .. import as_chat
from ..as_chat import FieldRules
from .protocol import ResponsesRequest

#: Fields this module turns into chat fields (or echoes): never passed through as they are.
TRANSLATED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "metadata",
    }
)


def _none_or(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value is None or any(type(value) is type(v) and value == v for v in values)


def _all_null(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and all(v is None for v in value.values()))


#: Responses fields that would change the answer: refused unless the test says the value asks for nothing.
RESPONSES_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "previous_response_id": (_none_or(), "responses are not stored; send the whole conversation in input"),
    "conversation": (_none_or(), "conversations are not stored; send the whole conversation in input"),
    "prompt": (_none_or(), "stored prompt templates are not supported"),
    "background": (_none_or(False), "background responses are not supported"),
    "reasoning": (_all_null, "reasoning options are not supported"),
    "include": (_none_or([]), "no additional output data can be included"),
    "top_logprobs": (_none_or(0), "log-probabilities are not returned on /v1/responses"),
    "truncation": (_none_or("disabled"), 'only truncation "disabled" is served (an over-long input is refused)'),
}

#: Responses fields that change nothing here: reported unless they hold their no-change value.
RESPONSES_REPORTED: dict[str, Callable[[Any], bool]] = {
    "store": _none_or(False),
    "user": _none_or(),
    "safety_identifier": _none_or(),
    "prompt_cache_key": _none_or(),
    "prompt_cache_retention": _none_or(),
    "service_tier": _none_or("auto", "default"),
    "max_tool_calls": _none_or(),
    "stream_options": _none_or(),
}

#: Chat completion names of Responses fields: refused, naming the Responses name, unless they ask for nothing.
CHAT_NAMES = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "functions": "tools",
    "function_call": "tool_choice",
    "n": None,
    "extra_messages": None,
    "logprobs": None,
}

RULES = FieldRules(
    route="/v1/responses",
    refused=RESPONSES_REFUSED,
    reported=RESPONSES_REPORTED,
    chat_names=CHAT_NAMES,
    translated=TRANSLATED,
)

_MESSAGE_KEYS = frozenset({"type", "role", "content", "id", "status"})
_PART_KEYS = frozenset({"type", "text", "annotations", "logprobs"})
_CALL_KEYS = frozenset({"type", "call_id", "name", "arguments", "id", "status"})
_OUTPUT_KEYS = frozenset({"type", "call_id", "output", "id", "status"})
_TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})
_FORMAT_KEYS = frozenset({"type", "name", "schema", "description", "strict"})
_ROLES = frozenset({"user", "system", "developer", "assistant"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


_RENAMES = (
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_tokens", "max_output_tokens"),
    ("max_completion_tokens", "max_output_tokens"),
    ("tool_choice.function", "tool_choice"),
    ("messages", "input"),
)


class Translation(as_chat.Translation):
    """A Responses body translated (``as_chat.Translation``)."""

    renames = _RENAMES
    turns = "input"


def translate(body: dict[str, Any], strict: bool) -> Translation:
    """The chat body for a Responses body; raises a ``MillmError`` naming the Responses location."""
    request = validate(ResponsesRequest, body)
    reported: list[str] = []
    chat: dict[str, Any] = {"model": request.model}
    RULES.refuse(body)
    reported.extend(RULES.reported_in(body))
    messages, sources = _messages(request, reported)
    chat["messages"] = messages
    if request.max_output_tokens is not None:
        chat["max_tokens"] = request.max_output_tokens
    for name in ("temperature", "top_p", "stream", "parallel_tool_calls"):
        if getattr(request, name) is not None:
            chat[name] = getattr(request, name)
    if request.tools:
        chat["tools"] = [_tool(tool, i, reported) for i, tool in enumerate(request.tools)]
    if request.tool_choice is not None:
        chat["tool_choice"] = _tool_choice(request.tool_choice)
    if request.text is not None:
        response_format = _text(request.text, reported)
        if response_format is not None:
            chat["response_format"] = response_format
    RULES.pass_on(body, chat)
    RULES.refuse_unused(strict, reported)
    return Translation(request=request, chat=chat, reported=reported, sources=sources)


def _report_keys(item: dict[str, Any], known: frozenset[str], where: str, reported: list[str]) -> None:
    reported.extend(f"{where}.{key}" for key in item if key not in known)


def _messages(request: Any, reported: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat messages, and the Responses location each came from."""
    messages: list[dict[str, Any]] = []
    sources: list[str] = []
    if request.instructions is not None:
        messages.append({"role": "system", "content": request.instructions})
        sources.append("instructions")
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
        sources.append("input")
        return messages, sources
    for i, item in enumerate(request.input):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            _report_keys(item, _MESSAGE_KEYS, where, reported)
            messages.append({"role": _role(item, where), "content": _content(item.get("content"), where, reported)})
            sources.append(where)
        elif kind == "function_call":
            _report_keys(item, _CALL_KEYS, where, reported)
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # text then calls: one assistant turn
                last.setdefault("tool_calls", []).append(call)
                if not last["content"]:
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                sources.append(where)
        elif kind == "function_call_output":
            _report_keys(item, _OUTPUT_KEYS, where, reported)
            output = item.get("output")
            if not isinstance(output, str):
                output = _content(output, where, reported, key="output")
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": output})
            sources.append(where)
        elif kind == "reasoning":  # an earlier turn's thinking, sent back: templates leave it out, and so does this
            continue
        elif isinstance(kind, str):
            raise FieldNotHonoured(
                f"input items of type {kind!r} are not supported; only message, function_call and function_call_output",
                param=f"{where}.type",
            )
        else:
            raise InvalidParameter(f"{where} must be a message (role and content) or a typed item", param=where)
    return messages, sources


def _role(item: dict[str, Any], where: str) -> str:
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidParameter(f"{where}.role must be one of {sorted(_ROLES)}", param=f"{where}.role")
    return role


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidParameter(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


def _content(content: Any, where: str, reported: list[str], key: str = "content") -> str:
    """A message's content as text: a string, or text parts joined; other parts are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidParameter(f"{where}.{key} must be a string or a list of parts", param=f"{where}.{key}")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}.{key}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidParameter(f"{at} must be an object with a type", param=at)
        if part["type"] not in _TEXT_PARTS:
            raise FieldNotHonoured(f"content parts of type {part['type']!r} are not supported; only text", param=at)
        if not isinstance(part.get("text"), str):
            raise InvalidParameter(f"{at}.text must be a string", param=f"{at}.text")
        _report_keys(part, _PART_KEYS, at, reported)
        texts.append(part["text"])
    return "".join(texts)


def _tool(tool: dict[str, Any], index: int, reported: list[str]) -> dict[str, Any]:
    where = f"tools[{index}]"
    if tool.get("type") != "function":
        raise FieldNotHonoured(
            f"tools of type {tool.get('type')!r} are not supported; only function tools", param=f"{where}.type"
        )
    _report_keys(tool, _TOOL_KEYS, where, reported)
    # strict goes on: the chat rules honour it (every call held to its parameters) or refuse it
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if tool.get(key) is not None}
    return {"type": "function", "function": function}


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise FieldNotHonoured(
        f'tool_choice of type {choice.get("type")!r} is not supported; send "auto", "none", "required" or a function',
        param="tool_choice.type",
    )


def _text(text: dict[str, Any], reported: list[str]) -> dict[str, Any] | None:
    """``text.format`` as a chat ``response_format`` (None for plain text)."""
    _report_keys(text, frozenset({"format", "verbosity"}), "text", reported)
    if text.get("verbosity") not in (None, "medium"):
        reported.append("text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidParameter("text.format must be an object", param="text.format")
    _report_keys(fmt, _FORMAT_KEYS, "text.format", reported)
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {key: fmt[key] for key in ("name", "schema", "description", "strict") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidParameter(
        f"text.format.type must be text, json_object or json_schema, not {kind!r}", param="text.format.type"
    )
