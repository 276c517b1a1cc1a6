"""The three tool-call formats: how each family writes a call, and reading it back.

| Family                | The model writes                                               |
|-----------------------|----------------------------------------------------------------|
| LFM2 / LFM2.5         | ``<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>`` |
| Hermes-style, Qwen2.5 | ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``       |
| Llama 3.1 / 3.2 / 3.3 | ``{"name": …, "parameters": {…}}`` as the whole reply          |

Each format says where in a growing reply a call may start (so a streaming
filter holds that text back), how to write a call into history for a template
that does not render ``tool_calls`` itself, and how to parse a reply. Parsing never raises: a reply that is not a
well-formed call gives ``None`` and is returned as plain content.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedReply:
    """The calls a reply makes and any text the model wrote after them."""

    calls: list[ParsedCall]
    trailing: str = ""


def call_from(obj: Any, argument_keys: tuple[str, ...]) -> ParsedCall | None:
    """``{"name": ..., "<arguments key>": {...}}`` (arguments may be a JSON string)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in argument_keys:
        if key in obj:
            args = obj[key]
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    return None
            return ParsedCall(obj["name"], args) if isinstance(args, dict) else None
    return ParsedCall(obj["name"], {})


def _partial_marker_start(text: str, marker: str) -> int:
    """Index of a tail of ``text`` that could be the start of ``marker`` (len(text) if none)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return len(text) - n
    return len(text)


class CallFormat:
    """One family's call syntax. Subclasses fill in its operations."""

    name = ""

    def hold_from(self, text: str) -> int:
        """Where in the reply so far a call may begin (``len(text)``: nowhere yet)."""
        raise NotImplementedError

    def render(self, calls: list[ParsedCall]) -> str:
        """Calls as the model writes them, for history in a template that cannot."""
        raise NotImplementedError

    def parse(self, text: str) -> ParsedReply | None:
        """The calls in ``text`` (which begins where ``hold_from`` pointed), or None."""
        raise NotImplementedError

    def starts_call(self, text: str) -> bool:
        """Whether held ``text`` is (the start of) a call, so that a reply cut there must not show it as content."""
        raise NotImplementedError

    def cut_calls(self, text: str) -> list[ParsedCall] | None:
        """The complete calls at the head of a reply ``max_tokens`` cut (None: read them as they streamed)."""
        return None


class HermesFormat(CallFormat):
    """Hermes-style and Qwen2.5: ``<tool_call>`` JSON blocks."""

    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"

    def hold_from(self, text: str) -> int:
        found = text.find(self.start)
        return found if found >= 0 else _partial_marker_start(text, self.start)

    def render(self, calls: list[ParsedCall]) -> str:
        return "\n".join(
            f"{self.start}\n{json.dumps({'name': c.name, 'arguments': c.arguments}, ensure_ascii=False)}\n{self.end}"
            for c in calls
        )

    def parse(self, text: str) -> ParsedReply | None:
        calls: list[ParsedCall] = []
        pos = 0
        while True:
            begin = len(text) - len(text[pos:].lstrip())
            if not text.startswith(self.start, begin):
                break
            body_start = begin + len(self.start)
            close = text.find(self.end, body_start)
            body = text[body_start:] if close < 0 else text[body_start:close]
            try:
                call = call_from(json.loads(body), ("arguments", "parameters"))
            except ValueError:
                return None
            if call is None:
                return None
            calls.append(call)
            pos = len(text) if close < 0 else close + len(self.end)
        return ParsedReply(calls, text[pos:]) if calls else None

    def starts_call(self, text: str) -> bool:
        return _begins_with(text.lstrip(), self.start)


class PythonicFormat(CallFormat):
    """LFM2 / LFM2.5: a Python list of calls between ``<|tool_call_start|>`` and ``<|tool_call_end|>``.

    Those markers are special tokens in LFM2's own tokenizer, which decoded text
    may leave out, so a reply that is nothing but such a list is read as calls too.
    """

    name = "pythonic"
    start, end = "<|tool_call_start|>", "<|tool_call_end|>"

    def hold_from(self, text: str) -> int:
        stripped = text.lstrip()
        if not stripped or stripped.startswith("["):
            return 0
        found = text.find(self.start)
        return found if found >= 0 else _partial_marker_start(text, self.start)

    def render(self, calls: list[ParsedCall]) -> str:
        written = ", ".join(
            f"{c.name}({', '.join(f'{k}={python_literal(v)}' for k, v in c.arguments.items())})" for c in calls
        )
        return f"{self.start}[{written}]{self.end}"

    def parse(self, text: str) -> ParsedReply | None:
        stripped = text.lstrip()
        body = stripped[len(self.start) :] if stripped.startswith(self.start) else stripped
        close = body.find(self.end)
        if close >= 0:
            calls = _pythonic_calls(body[:close]) or _json_calls(body[:close])
            return ParsedReply(calls, body[close + len(self.end) :]) if calls else None
        # No end marker (left out of the decoded text, or EOS came first): the
        # calls are the shortest prefix that is a whole list; the rest is content.
        for end in (i + 1 for i, ch in enumerate(body) if ch == "]"):
            calls = _pythonic_calls(body[:end]) or _json_calls(body[:end])
            if calls:
                return ParsedReply(calls, body[end:])
        calls = _pythonic_calls(body)
        return ParsedReply(calls) if calls else None

    def starts_call(self, text: str) -> bool:
        stripped = text.lstrip()
        if _begins_with(stripped, self.start):
            return True
        return stripped == "[" or re.match(r'\[\s*(\{|"|[A-Za-z_][\w-]*(\(|$))', stripped) is not None

    def cut_calls(self, text: str) -> list[ParsedCall] | None:
        """The calls before the cut one: the longest prefix that a closing ``]`` makes a whole list."""
        stripped = text.lstrip()
        body = stripped[len(self.start) :] if stripped.startswith(self.start) else stripped
        for end in (i + 1 for i in range(len(body) - 1, -1, -1) if body[i] in ")}"):
            calls = _pythonic_calls(body[:end] + "]") or _json_calls(body[:end] + "]")
            if calls:
                return calls
        return None


class Llama3JsonFormat(CallFormat):
    """Llama 3.1 / 3.2 / 3.3 custom tools: the whole reply is ``{"name": …, "parameters": {…}}``.

    Several calls may follow one another, separated by ``;``.
    """

    name = "llama3_json"

    def hold_from(self, text: str) -> int:
        stripped = text.lstrip()
        return 0 if not stripped or stripped.startswith("{") else len(text)

    def render(self, calls: list[ParsedCall]) -> str:
        return "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls)

    def parse(self, text: str) -> ParsedReply | None:
        decoder = json.JSONDecoder()
        body = text.strip()
        calls: list[ParsedCall] = []
        pos = 0
        while pos < len(body):
            try:
                obj, pos = decoder.raw_decode(body, pos)
            except ValueError:
                return None
            call = call_from(obj, ("parameters", "arguments"))
            if call is None:
                return None
            calls.append(call)
            rest = body[pos:].lstrip()
            if rest.startswith(";"):
                rest = rest[1:].lstrip()
            pos = len(body) - len(rest)
        return ParsedReply(calls) if calls else None

    def starts_call(self, text: str) -> bool:
        return _begins_with(re.sub(r"\s+", "", text), '{"name"')


def _begins_with(text: str, marker: str) -> bool:
    """``text`` begins with ``marker``, or is a non-empty start of it."""
    return text.startswith(marker) or (bool(text) and marker.startswith(text))


def _pythonic_calls(body: str) -> list[ParsedCall] | None:
    """``[f(a=1), g(b='x')]`` (or one bare call) with keyword arguments only."""
    source = body.strip()
    try:
        tree = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        try:
            arguments = {kw.arg: _literal(kw.value, source) for kw in node.keywords if kw.arg is not None}
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        if len(arguments) != len(node.keywords):
            return None  # **kwargs
        calls.append(ParsedCall(node.func.id, arguments))
    return calls or None


_JSON_NAMES = {"true": True, "false": False, "null": None}


def _literal(node: ast.AST, source: str) -> Any:
    """A Python literal, also accepting JSON's true/false/null (models mix the two).

    A double-quoted string is read as JSON where it is JSON (the grammar writes
    JSON values): ``"\\/"`` and surrogate pairs mean what they mean in JSON.
    """
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_literal(e, source) for e in node.elts]
    if isinstance(node, ast.Dict):
        keys = [k for k in node.keys if k is not None]  # None: a ``**mapping`` unpacked
        if len(keys) < len(node.keys):
            raise ValueError("dict unpacking")
        return {_literal(k, source): _literal(v, source) for k, v in zip(keys, node.values, strict=False)}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        written = ast.get_source_segment(source, node) or ""
        if written.startswith('"'):
            try:
                return json.loads(written)
            except ValueError:
                pass  # Python's own escapes, or strings written one after another
    return ast.literal_eval(node)


def _json_calls(body: str) -> list[ParsedCall] | None:
    """LFM2's JSON variant: ``[{"name": ..., "arguments": {...}}, ...]``."""
    try:
        items = json.loads(body)
    except ValueError:
        return None
    items = items if isinstance(items, list) else [items]
    calls = [call_from(item, ("arguments", "parameters")) for item in items]
    return calls if calls and all(calls) else None  # type: ignore[return-value]


def python_literal(value: Any) -> str:
    """A JSON value written as a Python literal (strings double-quoted, as LFM2 writes them)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {python_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


HERMES = HermesFormat()
PYTHONIC = PythonicFormat()
LLAMA3_JSON = Llama3JsonFormat()
