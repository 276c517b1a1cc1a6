"""The per-sequence output filter that turns a reply's calls into OpenAI ``tool_calls``.

Text that cannot be part of a call streams as content at once; from where a
call may start, text is held back. A call in JSON (``stream.CallStream``) is
streamed as it is written: its id and name, then its arguments. When the
sequence ends the held text is parsed: calls to offered functions become
``tool_calls`` (finish_reason ``tool_calls``); anything else is released as
plain content, finish_reason unchanged. Never an error.

A reply ``max_tokens`` cut (finish_reason ``length``) keeps its complete calls
and drops the cut one: the call syntax is never returned as content.
"""

from __future__ import annotations

from typing import Any

from millm_host.api import FilterResult

from .formats import CallFormat, ParsedReply
from .stream import (
    HERMES_SEPARATORS,
    LLAMA3_SEPARATORS,
    PYTHONIC_JSON_SEPARATORS,
    CallStream,
    Separators,
    call_id,
)

__all__ = ["ToolCallFilter", "call_id", "calls_result"]

_SEPARATORS: dict[str, Separators] = {
    "hermes": HERMES_SEPARATORS,
    "llama3_json": LLAMA3_SEPARATORS,
    "pythonic": PYTHONIC_JSON_SEPARATORS,  # LFM2's JSON variant; its Python calls go out when the reply ends
}


def calls_result(
    tool_calls: list[dict[str, Any]], finish_reason: str, text: str = "", *, has_content: bool = False
) -> FilterResult:
    """The end of a sequence that called ``tool_calls`` (already queued as stream deltas).

    ``text`` is still to be sent as content; ``has_content``: the reply has some, else ``content`` is null.
    A reply ``max_tokens`` cut keeps ``length``; otherwise the finish_reason is ``tool_calls``.
    """
    extras: dict[str, Any] = {"tool_calls": tool_calls}
    if not has_content:
        extras["content"] = None
    return FilterResult(
        text=text, finish_reason="length" if finish_reason == "length" else "tool_calls", message_extras=extras
    )


class ToolCallFilter:
    """Holds back possible calls in one sequence, streams them as they are written and settles them at its end.

    ``live``: a grammar constrains the reply (as the plugin always does), so a
    call's arguments may stream before they end.
    """

    def __init__(self, fmt: CallFormat, names: frozenset[str], parallel: bool, *, live: bool = False) -> None:
        self.fmt = fmt
        self.names = names
        self.parallel = parallel
        self.live = live
        self.text = ""  # everything generated
        self.released = 0  # characters of ``text`` sent as content
        self.stream = self._new_stream()
        self._region_from = 0  # where in ``text`` the region the stream reads begins

    def _new_stream(self) -> CallStream:
        return CallStream(_SEPARATORS[self.fmt.name], self.names, live=self.live, limit=None if self.parallel else 1)

    def feed(self, text: str) -> str:
        self.text += text
        hold = max(self.released, self.fmt.hold_from(self.text))
        delta, self.released = self.text[self.released : hold], hold
        if self.released != self._region_from and not self.stream.calls:
            self.stream, self._region_from = self._new_stream(), self.released  # the possible call moved on
        if self._region_from == self.released:
            self.stream.feed(self.text[self.released :])
        return delta

    def take_deltas(self) -> list[dict[str, Any]]:
        """Stream deltas ready now: a call's opening (id, name), then pieces of its arguments."""
        return self.stream.take_deltas()

    def finish(self, finish_reason: str) -> FilterResult:
        held = self.text[self.released :]
        if finish_reason == "length":
            calls = None if self.stream.calls else self.fmt.cut_calls(held)
            tool_calls = self.stream.settle(calls if self.parallel or calls is None else calls[:1])
            if tool_calls:
                return calls_result(tool_calls, finish_reason, has_content=bool(self.text[: self.released].strip()))
            # a cut call is dropped; cut text that is no call is content
            return FilterResult(text="" if self.fmt.starts_call(held) else held)
        reply = self.fmt.parse(held) if held else None
        if reply is None or not self._offered(reply):
            if self.stream.opened:  # calls already streamed stay; the rest does not parse
                tool_calls = self.stream.settle(None)
                return calls_result(tool_calls, finish_reason, has_content=bool(self.text[: self.released].strip()))
            return FilterResult(text=held)
        calls = reply.calls if self.parallel else reply.calls[:1]
        trailing = reply.trailing if reply.trailing.strip() else ""
        tool_calls = self.stream.settle(calls)
        return calls_result(
            tool_calls, finish_reason, trailing, has_content=bool((self.text[: self.released] + trailing).strip())
        )

    def _offered(self, reply: ParsedReply) -> bool:
        return all(call.name in self.names for call in reply.calls)
