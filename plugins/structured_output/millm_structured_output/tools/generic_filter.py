"""The per-sequence output filter for the generic format: JSON replies back into content or ``tool_calls``.

A ``{"response": "…"}`` reply streams the string's text as content while it is
written; a call streams as ``tool_calls`` deltas (id and name, then its
arguments as they are written). With a ``response_format`` (``document``) the
answer is the document itself, streamed as content as soon as it cannot be a
call. A reply that is not one of the shapes (cut by ``max_tokens``) is
returned as it was written: the text of a cut answer; a cut call is dropped,
the complete calls before it kept, never its raw JSON.
"""

from __future__ import annotations

import json
import re

from millm_host.api import FilterResult

from .filter import calls_result
from .generic import parse_reply
from .stream import GENERIC_SEPARATORS, CallStream

_RESPONSE_OPENING = re.compile(r'\s*\{\s*"response"\s*:\s*"')
_STRING_DECODER = json.JSONDecoder(strict=False)
_CALL_OPENING = '{"tool_call'  # how both call shapes begin (the grammar's layout: no whitespace)


def complete_escapes(raw: str, start: int) -> tuple[int, bool]:
    """How far into ``raw`` (a JSON string's body, read from ``start``) the text is whole.

    Returns the index before any incomplete escape, or of the closing quote, and
    whether the closing quote was reached.
    """
    i, n = start, len(raw)
    while i < n:
        c = raw[i]
        if c == '"':
            return i, True
        if c != "\\":
            i += 1
            continue
        if i + 1 >= n:
            break
        if raw[i + 1] != "u":
            i += 2
            continue
        if i + 6 > n:
            break
        try:
            high_surrogate = 0xD800 <= int(raw[i + 2 : i + 6], 16) <= 0xDBFF
        except ValueError:
            high_surrogate = False
        step = 12 if high_surrogate else 6  # a surrogate pair is decoded as one character
        if i + step > n:
            break
        i += step
    return i, False


class GenericToolFilter:
    """Streams an answer's text and a call's deltas; parses the whole reply when the sequence ends.

    ``document``: a ``response_format`` takes the place of ``{"response": "…"}``, so
    a reply that is not a call is the document, sent as content.
    """

    def __init__(self, names: frozenset[str], parallel: bool, *, document: bool = False) -> None:
        self.names = names
        self.parallel = parallel
        self.document = document
        self.text = ""  # everything generated
        self.body = -1  # where the answer string's body begins in ``text`` (-1: not an answer so far)
        self.scanned = 0  # characters of the body decoded and sent
        self.sent = ""  # the answer text sent so far
        self.closed = False
        self.released = 0  # ``document``: characters of ``text`` sent as content
        self.stream = CallStream(GENERIC_SEPARATORS, names, live=True, limit=None if parallel else 1)

    def feed(self, text: str) -> str:
        self.text += text
        if self._maybe_call():
            self.stream.feed(self.text)
            return ""
        if self.document:
            delta, self.released = self.text[self.released :], len(self.text)
            return delta
        if self.body < 0:
            opening = _RESPONSE_OPENING.match(self.text)
            if opening is None:
                return ""
            self.body = opening.end()
        if self.closed:
            return ""
        raw = self.text[self.body :]
        end, self.closed = complete_escapes(raw, self.scanned)
        try:
            delta = _STRING_DECODER.decode('"' + raw[self.scanned : end] + '"')
        except ValueError:  # a malformed escape (only possible unconstrained): hold the rest
            self.closed = True
            return ""
        self.scanned = end
        self.sent += delta
        return delta

    def take_deltas(self) -> list[dict]:
        """Stream deltas ready now: a call's opening (id, name), then pieces of its arguments."""
        return self.stream.take_deltas()

    def _maybe_call(self) -> bool:
        """Whether the reply so far is, or may still become, a call (nothing of it sent as content)."""
        if self.released:
            return False
        stripped = self.text.lstrip()
        return stripped.startswith(_CALL_OPENING) or _CALL_OPENING.startswith(stripped)

    def finish(self, finish_reason: str) -> FilterResult:
        reply = parse_reply(self.text) if finish_reason != "length" else None
        if self._maybe_call():
            if reply is not None and reply.response is None and all(c.name in self.names for c in reply.calls):
                tool_calls = self.stream.settle(reply.calls if self.parallel else reply.calls[:1])
                return calls_result(tool_calls, finish_reason)
            tool_calls = self.stream.settle(None)  # cut: the complete calls streamed so far
            if tool_calls:
                return calls_result(tool_calls, finish_reason)
            if finish_reason == "length":
                return FilterResult()  # a cut call is never content
        if self.document:
            return FilterResult(text=self.text[self.released :])
        if reply is None:
            return FilterResult(text="" if self.body >= 0 else self.text)
        if reply.response is not None:
            return FilterResult(text=reply.response[len(self.sent) :])
        return FilterResult(text=self.text)
