"""An Anthropic Messages body as the chat completion it asks for.

Each Messages field is honoured, reported or refused, as on chat completions:

- honoured by translation: ``system`` (a string or text blocks: a system message
  first), ``messages`` (user and assistant turns; text blocks, ``tool_use``
  blocks as the assistant's ``tool_calls``, ``tool_result`` blocks as ``tool``
  messages), ``max_tokens``, ``stop_sequences`` (``stop``), ``temperature``,
  ``top_p``, ``top_k`` (1, or 0, or any with temperature 0: each is greedy or no
  cut; another is refused, the engines sample without one), ``stream``, client
  ``tools`` (``input_schema`` is the function's ``parameters``), ``tool_choice``
  (``auto``, ``any`` as ``required``, ``none``, ``tool`` as a named function;
  ``disable_parallel_tool_use`` as ``parallel_tool_calls: false``),
  ``output_config.format`` (structured outputs: a json_schema ``response_format``),
  ``thinking`` (a thinking model's block as ``thinking`` blocks when enabled, left
  out otherwise: ``include_reasoning``; ``budget_tokens`` is reported);
- refused where they would change the answer (``MESSAGES_REFUSED``):
  ``mcp_servers``, ``container``,
  ``context_management``, server tools, image and document blocks; and the chat
  names of Messages fields (``stop``, ``response_format``, ...), which would
  otherwise be served under the wrong name;
- reported (``X-miLLM-Ignored-Fields``; refused under ``X-miLLM-Strict``):
  ``metadata``, ``service_tier``, ``speed``, ``cache_control`` (top-level and
  on blocks), ``inference_geo``, ``diagnostics``, ``user_profile_id``,
  ``workspace_id``, ``output_config.effort``, ``citations`` on blocks,
  ``is_error`` on a tool result, and unknown keys inside blocks, tools and
  ``tool_choice``.

Any other top-level field (``seed``, millm's ``steering``, ``profile``, ...)
passes through to the chat completion, whose rules honour, report or refuse it
under the same name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ...bodies.validate import validate
from ...errors import FieldNotHonoured, InvalidParameter
from .. import as_chat
from ..as_chat import FieldRules
from .protocol import MessagesCountFields, MessagesFields

#: Fields this module turns into chat fields (or reports): never passed through as they are.
TRANSLATED = frozenset(
    {
        "model",
        "thinking",
        "messages",
        "system",
        "max_tokens",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "tools",
        "tool_choice",
        "output_config",
    }
)


def _none_or(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value is None or any(type(value) is type(v) and value == v for v in values)


#: Messages fields that would change the answer: refused unless the test says the value asks for nothing.
MESSAGES_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "mcp_servers": (_none_or([]), "MCP servers are not supported"),
    "container": (_none_or(), "containers are not supported"),
    "context_management": (_none_or(), "context management is not supported"),
}

#: Messages fields that change nothing here: reported unless they hold their no-change value.
MESSAGES_REPORTED: dict[str, Callable[[Any], bool]] = {
    "service_tier": _none_or("auto", "standard_only"),
    "speed": _none_or("standard"),
    "cache_control": _none_or(),
    "inference_geo": _none_or(),
    "diagnostics": _none_or(),
    "user_profile_id": _none_or(),
    "workspace_id": _none_or(),
}

#: Chat completion names of Messages fields: refused, naming the Messages name, unless they ask for nothing.
CHAT_NAMES = {
    "stop": "stop_sequences",
    "max_completion_tokens": "max_tokens",
    "functions": "tools",
    "function_call": "tool_choice",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
    "response_format": "output_config.format",
    "n": None,
    "extra_messages": None,
    "logprobs": None,
    "top_logprobs": None,
    "stream_options": None,
}

RULES = FieldRules(
    route="/v1/messages",
    refused=MESSAGES_REFUSED,
    reported=MESSAGES_REPORTED,
    chat_names=CHAT_NAMES,
    translated=TRANSLATED,
)

_MESSAGE_KEYS = frozenset({"role", "content"})
_TEXT_KEYS = frozenset({"type", "text"})
_TOOL_USE_KEYS = frozenset({"type", "id", "name", "input"})
_TOOL_RESULT_KEYS = frozenset({"type", "tool_use_id", "content"})
_TOOL_KEYS = frozenset({"type", "name", "description", "input_schema", "strict"})
_CHOICE_KEYS = frozenset({"type", "name", "disable_parallel_tool_use"})
_ROLES = ("user", "assistant")
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


_RENAMES = (
    ("response_format.json_schema.schema", "output_config.format.schema"),
    ("response_format", "output_config.format"),
    ("stop", "stop_sequences"),
    ("max_completion_tokens", "max_tokens"),
    ("tool_choice.function", "tool_choice"),
    ("parallel_tool_calls", "tool_choice.disable_parallel_tool_use"),
)


class Translation(as_chat.Translation):
    """A Messages body translated (``as_chat.Translation``)."""

    renames = _RENAMES
    turns = "messages"

    def tool_param(self, param: str) -> str:
        """``tools[0].function.parameters`` → ``tools[0].input_schema``; otherwise as on Responses."""
        param = re.sub(r"^tools\[(\d+)\]\.function\.parameters", r"tools[\1].input_schema", param)
        return super().tool_param(param)


def translate(body: dict[str, Any], strict: bool, *, counting: bool = False) -> Translation:
    """The chat body for a Messages body (``counting``: a count_tokens body, which generates nothing);
    raises a ``MillmError`` naming the Messages location."""
    top = {key: value for key, value in body.items() if key != "messages"}
    request = validate(MessagesCountFields if counting else MessagesFields, top)
    RULES.refuse(body)
    reported = RULES.reported_in(body)
    chat: dict[str, Any] = {"model": request.model}
    messages, sources = _messages(body.get("messages"), request.system, reported)
    chat["messages"] = messages
    if not counting:
        chat["max_tokens"] = request.max_tokens
        for name in ("temperature", "top_p", "stream"):
            if getattr(request, name) is not None:
                chat[name] = getattr(request, name)
        if request.stop_sequences:
            chat["stop"] = request.stop_sequences
        _top_k(request, chat)
        if request.metadata:
            reported.append("metadata")
        chat["include_reasoning"] = _thinking(body.get("thinking"), reported)
    if request.tools:
        chat["tools"] = [_tool(tool, i, reported) for i, tool in enumerate(request.tools)]
    if request.tool_choice is not None:
        _tool_choice(request.tool_choice, chat, reported)
    if request.output_config is not None:
        response_format = _output_config(request.output_config, reported)
        if response_format is not None:
            chat["response_format"] = response_format
    RULES.pass_on(body, chat)
    RULES.refuse_unused(strict, reported)
    return Translation(request=request, chat=chat, reported=reported, sources=sources)


def _thinking(value: Any, reported: list[str]) -> bool:
    """``thinking``: whether the reply carries a thinking model's block (``include_reasoning``).

    ``enabled`` (or ``adaptive``) shows it as ``thinking`` blocks; ``disabled`` or none
    leaves it out, as Anthropic does. The model thinks or not by its template
    (``millm_host.reasoning``), so ``budget_tokens`` is reported, not honoured.
    """
    if value is None:
        return False
    if not isinstance(value, dict) or value.get("type") not in ("enabled", "disabled", "adaptive"):
        raise InvalidParameter(
            'thinking must be {"type": "enabled", "budget_tokens": N}, {"type": "adaptive"} or {"type": "disabled"}',
            param="thinking",
        )
    budget = value.get("budget_tokens")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
        raise InvalidParameter("thinking.budget_tokens must be a positive integer", param="thinking.budget_tokens")
    if budget is not None:
        reported.append("thinking.budget_tokens")
    _report_keys(value, frozenset({"type", "budget_tokens"}), "thinking", reported)
    return value["type"] != "disabled"


def _top_k(request: Any, chat: dict[str, Any]) -> None:
    """top_k 1 is greedy whatever the temperature; 0 cuts nothing; any top_k is greedy at temperature 0."""
    if request.top_k in (None, 0) or request.temperature == 0:
        return
    if request.top_k == 1:
        chat["temperature"] = 0.0
        return
    raise FieldNotHonoured(
        f"top_k {request.top_k} cannot be honoured: tokens are drawn from the whole distribution (with top_p); "
        "send top_k 1 (greedy), 0, or temperature 0",
        param="top_k",
    )


def _report_keys(item: dict[str, Any], known: frozenset[str], where: str, reported: list[str]) -> None:
    reported.extend(f"{where}.{key}" for key in item if key not in known)


def _messages(
    messages: Any, system: str | list[dict[str, Any]] | None, reported: list[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat messages, and the Messages location each came from."""
    if messages is None:
        raise InvalidParameter("messages is required", param="messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidParameter("messages must be a non-empty list of messages", param="messages")
    out: list[dict[str, Any]] = []
    sources: list[str] = []
    if system is not None:
        text = system if isinstance(system, str) else _text(system, "system", reported)
        if text:
            out.append({"role": "system", "content": text})
            sources.append("system")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidParameter(f"{where} must be an object with role and content", param=where)
        role = message.get("role")
        if role not in _ROLES:
            raise InvalidParameter(f'{where}.role must be "user" or "assistant"', param=f"{where}.role")
        _report_keys(message, _MESSAGE_KEYS, where, reported)
        content = message.get("content")
        if isinstance(content, str):
            turns = [{"role": role, "content": content}]
        elif isinstance(content, list) and content:
            turns = _assistant(content, where, reported) if role == "assistant" else _user(content, where, reported)
        else:
            raise InvalidParameter(
                f"{where}.content must be a string or a non-empty list of content blocks", param=f"{where}.content"
            )
        out.extend(turns)
        sources.extend([where] * len(turns))
    return out, sources


def _block(block: Any, at: str) -> str:
    """The block's type, once it is known to be an object with one."""
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise InvalidParameter(f"{at} must be a content block (an object with a type)", param=at)
    return block["type"]


def _unsupported(kind: str, at: str, allowed: str) -> FieldNotHonoured:
    return FieldNotHonoured(
        f"content blocks of type {kind[:40]!r} are not supported here; only {allowed}", param=f"{at}.type"
    )


def _text_of(block: dict[str, Any], at: str, reported: list[str]) -> str:
    if not isinstance(block.get("text"), str):
        raise InvalidParameter(f"{at}.text must be a string", param=f"{at}.text")
    _report_keys(block, _TEXT_KEYS, at, reported)
    return block["text"]


def _text(blocks: list[Any], where: str, reported: list[str]) -> str:
    """Text blocks joined (``system``, a tool result's content); any other block is refused."""
    texts = []
    for j, block in enumerate(blocks):
        at = f"{where}[{j}]"
        kind = _block(block, at)
        if kind != "text":
            raise _unsupported(kind, at, "text")
        texts.append(_text_of(block, at, reported))
    return "".join(texts)


def _user(blocks: list[Any], where: str, reported: list[str]) -> list[dict[str, Any]]:
    """A user turn: each ``tool_result`` a ``tool`` message, each run of text blocks one user message, in order."""
    turns: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = _block(block, at)
        if kind == "text":
            texts.append(_text_of(block, at, reported))
        elif kind == "tool_result":
            if texts:
                turns.append({"role": "user", "content": "".join(texts)})
                texts = []
            turns.append(_tool_result(block, at, reported))
        elif kind == "tool_use":
            raise InvalidParameter(f"{at}: tool_use blocks belong in an assistant turn", param=f"{at}.type")
        else:
            raise _unsupported(kind, at, "text and tool_result in a user turn")
    if texts:
        turns.append({"role": "user", "content": "".join(texts)})
    return turns


def _tool_result(block: dict[str, Any], at: str, reported: list[str]) -> dict[str, Any]:
    _report_keys(block, _TOOL_RESULT_KEYS | {"is_error"}, at, reported)
    if block.get("is_error") not in (None, False):
        reported.append(f"{at}.is_error")
    content = block.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list):
        content = _text(content, f"{at}.content", reported)
    elif not isinstance(content, str):
        raise InvalidParameter(f"{at}.content must be a string or text blocks", param=f"{at}.content")
    return {"role": "tool", "tool_call_id": _string(block, "tool_use_id", at), "content": content}


def _assistant(blocks: list[Any], where: str, reported: list[str]) -> list[dict[str, Any]]:
    """An assistant turn: its text blocks joined, its ``tool_use`` blocks as ``tool_calls``."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = _block(block, at)
        if kind == "text":
            texts.append(_text_of(block, at, reported))
        elif kind == "tool_use":
            _report_keys(block, _TOOL_USE_KEYS, at, reported)
            arguments = block.get("input")
            if not isinstance(arguments, dict):
                raise InvalidParameter(f"{at}.input must be an object", param=f"{at}.input")
            calls.append(
                {
                    "id": _string(block, "id", at),
                    "type": "function",
                    "function": {"name": _string(block, "name", at), "arguments": json.dumps(arguments)},
                }
            )
        elif kind == "tool_result":
            raise InvalidParameter(f"{at}: tool_result blocks belong in a user turn", param=f"{at}.type")
        elif kind in ("thinking", "redacted_thinking"):
            pass  # a reply's thinking sent back, as Anthropic's clients do: the template leaves it out too
        else:
            raise _unsupported(kind, at, "text, tool_use and thinking in an assistant turn")
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        turn["tool_calls"] = calls
    return [turn]


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidParameter(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


def _tool(tool: Any, index: int, reported: list[str]) -> dict[str, Any]:
    where = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise InvalidParameter(f"{where} must be an object", param=where)
    if tool.get("type") not in (None, "custom"):
        raise FieldNotHonoured(
            f"tools of type {str(tool.get('type'))[:40]!r} (Anthropic's server tools) are not supported; "
            "only client tools (name, description, input_schema)",
            param=f"{where}.type",
        )
    _report_keys(tool, _TOOL_KEYS, where, reported)
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise InvalidParameter(f"{where}.input_schema must be an object (a JSON Schema)", param=f"{where}.input_schema")
    function: dict[str, Any] = {"name": _string(tool, "name", where), "parameters": schema}
    for key in ("description", "strict"):  # strict goes on: the chat rules honour it or refuse it
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _tool_choice(choice: dict[str, Any], chat: dict[str, Any], reported: list[str]) -> None:
    _report_keys(choice, _CHOICE_KEYS, "tool_choice", reported)
    kind = choice.get("type")
    if kind in _CHOICES:
        chat["tool_choice"] = _CHOICES[kind]
    elif kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": _string(choice, "name", "tool_choice")}}
    else:
        raise InvalidParameter(
            f"tool_choice.type must be auto, any, tool or none, not {str(kind)[:40]!r}", param="tool_choice.type"
        )
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidParameter(
            "tool_choice.disable_parallel_tool_use must be a boolean", param="tool_choice.disable_parallel_tool_use"
        )
    if parallel and kind != "none":
        chat["parallel_tool_calls"] = False


def _output_config(config: dict[str, Any], reported: list[str]) -> dict[str, Any] | None:
    """``output_config.format`` (structured outputs) as a chat ``response_format``; ``effort`` is reported."""
    _report_keys(config, frozenset({"format", "effort"}), "output_config", reported)
    if config.get("effort") is not None:
        reported.append("output_config.effort")
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise InvalidParameter(
            'output_config.format must be {"type": "json_schema", "schema": {...}}', param="output_config.format"
        )
    _report_keys(fmt, frozenset({"type", "schema"}), "output_config.format", reported)
    if not isinstance(fmt.get("schema"), dict):
        raise InvalidParameter("output_config.format.schema must be an object", param="output_config.format.schema")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
