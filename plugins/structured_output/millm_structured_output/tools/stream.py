"""Streaming tool calls as OpenAI does: each call's id and name first, then its arguments as they are written.

A ``CallStream`` reads the calls region of a reply (the text from where the
first call begins) each time it grows. Calls whose body is a JSON object
``{"name": …, "arguments": {…}}`` (Hermes, Llama 3's ``parameters``, the generic
shapes, LFM2's JSON variant) are found by their head, anchored after the
format's separator; the arguments object is then followed character by
character (strings, escapes, nesting) to find where it ends.

``live``: a grammar constrains the reply, so every prefix becomes a valid call.
The call's id and name go out as soon as the name is written, then each new
piece of its arguments. Unconstrained, a call goes out (name, then arguments)
only once its arguments are a whole JSON object that parses, so a malformed
call is never half sent. Either way a name the request did not offer stops the
reading: the rest is left to the filter's parse of the whole reply.

``settle`` gives the reply's final ``tool_calls``: the ids and argument text
already streamed are kept, so a client's concatenated deltas equal them.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from .formats import ParsedCall

#: A call's head up to its arguments value. Names are ``[A-Za-z0-9_-]`` (checked on the request).
_HEAD = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_-]*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')


def call_id() -> str:
    """An OpenAI-style tool call id (``call_`` and 24 random characters)."""
    return "call_" + secrets.token_urlsafe(18)


@dataclass(frozen=True)
class Separators:
    """What comes before the first call's head, and between one call's arguments and the next head."""

    first: re.Pattern[str]
    next: re.Pattern[str]


HERMES_SEPARATORS = Separators(re.compile(r"\s*<tool_call>\s*"), re.compile(r"\s*\}\s*</tool_call>\s*<tool_call>\s*"))
LLAMA3_SEPARATORS = Separators(re.compile(r"\s*"), re.compile(r"\s*\}\s*;?\s*"))
PYTHONIC_JSON_SEPARATORS = Separators(re.compile(r"\s*(?:<\|tool_call_start\|>)?\s*\[\s*"), re.compile(r"\s*\}\s*,\s*"))
GENERIC_SEPARATORS = Separators(re.compile(r'\s*\{\s*"tool_calls?"\s*:\s*\[?\s*'), re.compile(r"\s*\}\s*,\s*"))


@dataclass
class StreamedCall:
    id: str
    name: str
    arguments: str = ""  # the arguments' text, as written
    streamed: str | None = None  # the arguments' text streamed so far (None: the call is not opened yet)
    complete: bool = False


class CallStream:
    """Finds calls in a growing region of a reply and queues their stream deltas."""

    def __init__(self, separators: Separators, names: frozenset[str], *, live: bool, limit: int | None = None) -> None:
        self.separators = separators
        self.names = names
        self.live = live
        self.limit = limit
        self.calls: list[StreamedCall] = []
        self.deltas: list[dict[str, Any]] = []
        self.stopped = False
        self._pos = 0  # where the next head (or the current arguments' scan) continues
        self._start = -1  # where the current arguments object begins (-1: looking for a head)
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, region: str) -> None:
        """Read ``region`` (the calls region so far; it only grows) and queue what can be sent."""
        while not self.stopped:
            if self._start < 0 and not self._head(region):
                return
            if not self._scan(region):
                self._send_live(region)
                return
            self._close(region)

    @property
    def opened(self) -> bool:
        """Whether a call went out already (its id and name are the client's now)."""
        return any(call.streamed is not None for call in self.calls)

    def take_deltas(self) -> list[dict[str, Any]]:
        """The stream deltas queued since the last call (each ``{"tool_calls": [...]}``)."""
        deltas, self.deltas = self.deltas, []
        return deltas

    def settle(self, parsed: list[ParsedCall] | None) -> list[dict[str, Any]]:
        """The final ``tool_calls``: ``parsed`` (the whole reply's calls) or, when None, the complete calls read here.

        Calls streamed already keep their ids and argument text; anything not yet
        streamed is queued now.
        """
        final: list[StreamedCall]
        if parsed is None:
            final = [c for c in self.calls if c.complete]
        else:
            final = []
            for i, call in enumerate(parsed):
                seen = self.calls[i] if i < len(self.calls) and self.calls[i].name == call.name else None
                written = json.dumps(call.arguments, ensure_ascii=False)
                if seen is None:
                    final.append(StreamedCall(call_id(), call.name, written))
                else:
                    if not seen.complete:
                        seen.arguments = written
                    final.append(seen)
        for index, streamed in enumerate(final):
            self._send(index, streamed)
        return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in final]

    def _head(self, region: str) -> bool:
        """Open the next call when its head is written; False while it is not (yet)."""
        if self.limit is not None and len(self.calls) >= self.limit:
            return False
        separator = self.separators.next if self.calls else self.separators.first
        gap = separator.match(region, self._pos)
        head = _HEAD.match(region, gap.end()) if gap is not None else None
        if head is None:
            return False
        if head.group(1) not in self.names:
            self.stopped = True  # not a call this request offers: the whole reply's parse decides
            return False
        self.calls.append(StreamedCall(call_id(), head.group(1)))
        self._start = self._pos = head.end()
        self._depth, self._in_string, self._escaped = 0, False, False
        return True

    def _scan(self, region: str) -> bool:
        """Follow the arguments object; True once it is closed (``_pos`` just after it)."""
        i = self._pos
        while i < len(region):
            c = region[i]
            i += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._pos = i
                    return True
        self._pos = i
        return False

    def _send_live(self, region: str) -> None:
        """Constrained: the open call's arguments so far go out (an unconstrained call waits for its end)."""
        if self.live and self.calls:
            call = self.calls[-1]
            call.arguments = region[self._start : self._pos]
            self._send(len(self.calls) - 1, call)

    def _close(self, region: str) -> None:
        call = self.calls[-1]
        call.arguments = region[self._start : self._pos]
        self._start = -1
        if self.live:
            call.complete = True
        else:
            try:
                call.complete = isinstance(json.loads(call.arguments), dict)
            except ValueError:
                call.complete = False
            if not call.complete:  # malformed: nothing of it was sent; the whole reply's parse decides
                self.calls.pop()
                self.stopped = True
                return
        self._send(len(self.calls) - 1, call)

    def _send(self, index: int, call: StreamedCall) -> None:
        """Queue what of ``call`` is not streamed yet: its opening (id, name), then new argument text."""
        if call.streamed is None:
            function = {"name": call.name, "arguments": ""}
            self.deltas.append(
                {"tool_calls": [{"index": index, "id": call.id, "type": "function", "function": function}]}
            )
            call.streamed = ""
        if len(call.arguments) > len(call.streamed) and call.arguments.startswith(call.streamed):
            piece = call.arguments[len(call.streamed) :]
            self.deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            call.streamed = call.arguments
