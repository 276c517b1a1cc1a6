"""The per-sequence output filter for the generic format: JSON replies back into content or ``tool_calls``.

A ``{"response": "…"}`` reply streams the string's text as content while it is
written; a call is held until the sequence ends, then becomes ``tool_calls``.
A reply that is not one of the shapes (cut by ``max_tokens`` or a stop string)
is returned as it was written: the text of a cut answer, the raw JSON of a cut call.
"""

from __future__ import annotations

import json
import re

from millm_host.api import FilterResult

from .filter import calls_result
from .generic import parse_reply

_RESPONSE_OPENING = re.compile(r'\s*\{\s*"response"\s*:\s*"')
_STRING_DECODER = json.JSONDecoder(strict=False)


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
    """Streams an answer's text, holds a call, and parses the whole reply when the sequence ends."""

    def __init__(self, names: frozenset[str], parallel: bool) -> None:
        self.names = names
        self.parallel = parallel
        self.text = ""  # everything generated
        self.body = -1  # where the answer string's body begins in ``text`` (-1: not an answer so far)
        self.scanned = 0  # characters of the body decoded and sent
        self.sent = ""  # the answer text sent so far
        self.closed = False

    def feed(self, text: str) -> str:
        self.text += text
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

    def finish(self, finish_reason: str) -> FilterResult:
        reply = parse_reply(self.text)
        if reply is None:
            return FilterResult(text="" if self.body >= 0 else self.text)
        if reply.response is not None:
            return FilterResult(text=reply.response[len(self.sent) :])
        if not all(call.name in self.names for call in reply.calls):
            return FilterResult(text=self.text)
        return calls_result(reply.calls if self.parallel else reply.calls[:1])
