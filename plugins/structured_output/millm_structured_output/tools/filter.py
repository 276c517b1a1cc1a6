"""The per-sequence output filter that turns a reply's calls into OpenAI ``tool_calls``.

Text that cannot be part of a call streams as content at once; from where a
call may start, text is held back until the sequence ends. Then the held text
is parsed: calls to offered functions become ``tool_calls`` (finish_reason
``tool_calls``); anything else is released as plain content, finish_reason
unchanged. Never an error.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from millm_host.api import FilterResult

from .formats import CallFormat, ParsedCall, ParsedReply


def call_id() -> str:
    """An OpenAI-style tool call id (``call_`` and 24 random characters)."""
    return "call_" + secrets.token_urlsafe(18)


def calls_result(calls: list[ParsedCall], text: str = "", *, has_content: bool = False) -> FilterResult:
    """The end of a sequence that called ``calls``: OpenAI ``tool_calls`` (one stream delta for them all).

    ``text`` is still to be sent as content; ``has_content``: the reply has some, else ``content`` is null.
    """
    tool_calls = [
        {
            "id": call_id(),
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for c in calls
    ]
    extras: dict[str, Any] = {"tool_calls": tool_calls}
    if not has_content:
        extras["content"] = None
    return FilterResult(
        text=text,
        finish_reason="tool_calls",
        message_extras=extras,
        stream_delta={"tool_calls": [{"index": i, **call} for i, call in enumerate(tool_calls)]},
    )


class ToolCallFilter:
    """Holds back possible calls in one sequence and parses them when it ends.

    ``opening`` is the call syntax a forced call put at the end of the prompt: the
    reply continues it, so the whole reply is held and parsed after it.
    """

    def __init__(self, fmt: CallFormat, names: frozenset[str], parallel: bool, opening: str = "") -> None:
        self.fmt = fmt
        self.names = names
        self.parallel = parallel
        self.opening = opening
        self.text = ""  # everything generated
        self.released = 0  # characters of ``text`` sent as content

    def feed(self, text: str) -> str:
        self.text += text
        if self.opening:
            return ""
        hold = max(self.released, self.fmt.hold_from(self.text))
        delta, self.released = self.text[self.released : hold], hold
        return delta

    def finish(self, finish_reason: str) -> FilterResult:
        held = self.text[self.released :]
        reply = self.fmt.parse(self.opening + held) if (held or self.opening) else None
        if reply is None or not self._offered(reply):
            return FilterResult(text=held)
        calls = reply.calls if self.parallel else reply.calls[:1]
        trailing = reply.trailing if reply.trailing.strip() else ""
        return calls_result(calls, trailing, has_content=bool((self.text[: self.released] + trailing).strip()))

    def _offered(self, reply: ParsedReply) -> bool:
        return all(call.name in self.names for call in reply.calls)
