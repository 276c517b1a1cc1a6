"""Reading ``tools``, ``tool_choice`` and ``parallel_tool_calls`` from a chat request."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from millm_host.api import InvalidParameter

_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolRequest:
    """What a request asks of function calling.

    ``choice`` is ``auto``, ``required``, ``function`` (``forced`` names it) or ``none``.
    """

    tools: list[dict[str, Any]]
    names: frozenset[str]
    choice: str
    forced: str | None
    parallel: bool
    #: The functions sent with ``strict: true``: their parameters must be in the served subset (else refused).
    strict: frozenset[str] = frozenset()

    @property
    def one_call(self) -> bool:
        """One call, not a list: ``parallel_tool_calls: false``, or a named function (which OpenAI calls once)."""
        return not self.parallel or self.choice == "function"

    @property
    def shown(self) -> bool:
        """The tools go to the template and the reply is parsed (not for ``none``)."""
        return bool(self.tools) and self.choice != "none"


def parse_tool_request(body: dict[str, Any]) -> ToolRequest | None:
    """The request's tool settings; None when it sends no tools and no tool_choice."""
    tools = _tools(body.get("tools"))
    choice, forced = _choice(body.get("tool_choice"), bool(tools))
    parallel = body.get("parallel_tool_calls")
    if parallel is None:
        parallel = True
    elif not isinstance(parallel, bool):
        raise InvalidParameter("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    names = frozenset(t["function"]["name"] for t in tools)
    if forced is not None and forced not in names:
        raise InvalidParameter(
            f"tool_choice names the function {forced!r}, which is not in tools", param="tool_choice.function.name"
        )
    if not tools and choice == "none":
        return None
    strict = frozenset(t["function"]["name"] for t in tools if t["function"].get("strict"))
    return ToolRequest(tools, names, choice, forced, parallel, strict)


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidParameter("tools must be an array of tool definitions", param="tools")
    seen: set[str] = set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise InvalidParameter(
                f'{where} must be {{"type": "function", "function": {{...}}}}', param=f"{where}.type"
            )
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidParameter(f"{where}.function must be an object", param=f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
            raise InvalidParameter(
                f"{where}.function.name must be 1-64 letters, digits, '_' or '-'", param=f"{where}.function.name"
            )
        if name in seen:
            raise InvalidParameter(f"the function {name!r} is defined twice", param=f"{where}.function.name")
        seen.add(name)
        if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
            raise InvalidParameter(
                f"{where}.function.parameters must be a JSON Schema object", param=f"{where}.function.parameters"
            )
        if function.get("description") is not None and not isinstance(function["description"], str):
            raise InvalidParameter(
                f"{where}.function.description must be a string", param=f"{where}.function.description"
            )
        if function.get("strict") is not None and not isinstance(function["strict"], bool):
            raise InvalidParameter(f"{where}.function.strict must be a boolean", param=f"{where}.function.strict")
    return value


def _choice(value: Any, has_tools: bool) -> tuple[str, str | None]:
    if value is None:
        return ("auto" if has_tools else "none"), None
    if value in ("none", "auto", "required"):
        choice, forced = value, None
    elif (
        isinstance(value, dict)
        and value.get("type") == "function"
        and isinstance(value.get("function"), dict)
        and isinstance(value["function"].get("name"), str)
    ):
        choice, forced = "function", value["function"]["name"]
    else:
        raise InvalidParameter(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    if choice != "none" and not has_tools:
        raise InvalidParameter(f"tool_choice {value!r} needs tools; the request sends none", param="tool_choice")
    return choice, forced
