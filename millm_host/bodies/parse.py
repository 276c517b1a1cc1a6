"""Parse a large JSON text in bounded slices, so no one C call holds the GIL for long (issue 11 §0).

``json``'s C scanner holds the GIL for a whole call: a 4 MiB body took 43 ms, and a
worker thread parsing it froze the event loop for all of that. Here the C scanner
only ever sees a slice of about ``SLICE`` characters:

- a value that fits in a slice is scanned whole;
- a longer array or object is walked member by member, and runs of its members are
  scanned together: the text up to the last comma in the next slice, wrapped in
  brackets, is tried as one array (or object). Started at a member's first character,
  that parses, to its end, only when the comma is one between members (a comma inside
  a string leaves the string open; one inside a nested value leaves it unclosed);
- a longer string is decoded in slices cut between escapes.

Between C calls the interpreter hands the GIL to other threads as usual. The result
is the value ``json.loads`` would give, with the same hooks; nesting past
``max_depth`` (the outermost container is level 1) raises ``TooDeep``, and more than
``max_containers`` objects and arrays in all raises ``TooManyContainers`` as soon as
the count passes it (a 4 MiB body can be 1.4 million empty arrays: building them,
walking them and freeing them each held the GIL for tens of ms).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from json import JSONDecodeError
from typing import Any

#: Characters one C call may scan (about 1 ms of GIL here).
SLICE = 32 * 1024
#: YIELD: after each run of members the parser gives the GIL up (``time.sleep(0)``) rather than wait
#: to be made to: a thread waiting for it (the event loop) otherwise waits out the switch interval,
#: and on a loaded machine its holder's turn on a CPU too.
#: A number longer than this is refused (no field takes one; it would be a long C call).
MAX_NUMBER_CHARS = 400


def _give_gil() -> None:
    """See YIELD; not on an event loop's own thread (a small body is parsed there inline): the loop
    would hand the GIL to a busy thread (a batch step) and wait out a switch interval to get it back."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        time.sleep(0)


_WHITESPACE = re.compile(r"[ \t\n\r]*")
#: Whole tokens of a string's inside: plain characters and complete escapes.
_STRING_BODY = re.compile(r'(?:[^"\\\x00-\x1f]+|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')
#: A string slice must not end between a surrogate pair's halves.
_HIGH_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")
_SCAN_FAILED = (JSONDecodeError, StopIteration, RecursionError)


class TooDeep(ValueError):
    """The text nests containers deeper than allowed."""


class TooManyContainers(ValueError):
    """The text holds more objects and arrays than allowed."""


def containers_in(value: Any, most: int) -> int:
    """The objects and arrays in ``value`` (itself included); the count stops once past ``most``."""
    stack = [value] if isinstance(value, (dict, list)) else []
    count = 0
    while stack and count <= most:
        node = stack.pop()
        count += 1
        stack.extend(
            child for child in (node.values() if isinstance(node, dict) else node) if isinstance(child, (dict, list))
        )
    return count


def nesting_exceeds(value: Any, max_depth: int) -> bool:
    """Whether ``value`` nests objects and arrays deeper than ``max_depth`` (the outermost is level 1).

    Level by level, allocating nothing per node (a tuple per node would cost
    garbage-collection passes on a body of millions of small containers).
    """
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 1
    while level:
        if depth > max_depth:
            return True
        below: list[Any] = []
        for node in level:
            below.extend(
                child
                for child in (node.values() if isinstance(node, dict) else node)
                if isinstance(child, (dict, list))
            )
        level, depth = below, depth + 1
    return False


#: Items of a partly parsed array freed in one C call (each may be a nest of 60 arrays).
FREE_SLICE = 256


def empty_in_slices(items: list[Any]) -> None:
    """Empty ``items`` from its end, ``FREE_SLICE`` items a C call."""
    while items:
        del items[-FREE_SLICE:]


def _run_end(pattern: re.Pattern[str], text: str, start: int, limit: int) -> int:
    """Where ``pattern`` (which matches the empty string too) stops matching from ``start``, before ``limit``."""
    found = pattern.match(text, start, limit)
    assert found is not None
    return found.end()


def loads_in_slices(
    text: str,
    decoder: json.JSONDecoder,
    max_depth: int,
    max_containers: int | None = None,
    short_ints: json.JSONDecoder | None = None,
    long_list: Callable[[list[Any], bool], None] | None = None,
) -> Any:
    """``decoder.decode(text)``, never scanning more than ``SLICE`` characters in one C call.

    ``short_ints``: a decoder that gives what ``decoder`` gives on text whose integers have
    fewer than ``LONG_DIGITS`` digits (``decoder`` less a ``parse_int`` hook, which the C
    scanner calls once per integer: 2M token ids spent most of their parse there). It
    scans the runs of members that hold no longer run of digits.

    ``long_list(items, plain)``: called with each array of at least ``LONG_LIST`` items
    once it is parsed; ``plain`` when it holds no object or array (known from its text,
    at no cost: a bracket inside a string counts as one, so ``plain`` is never wrongly true).
    """
    return _Parser(text, decoder, max_depth, max_containers, short_ints, long_list).parse()


#: Arrays from this many items on are reported to ``long_list``.
LONG_LIST = 4096
#: Digits from which a run of members is scanned by ``decoder`` itself (its ``parse_int`` sees them).
LONG_DIGITS = 19
_LONG_DIGIT_RUN = re.compile(f"[0-9]{{{LONG_DIGITS}}}")


class _Parser:
    def __init__(
        self,
        text: str,
        decoder: json.JSONDecoder,
        max_depth: int,
        max_containers: int | None,
        short_ints: json.JSONDecoder | None,
        long_list: Callable[[list[Any], bool], None] | None = None,
    ) -> None:
        self.text, self.n, self.max_depth = text, len(text), max_depth
        self.long_list = long_list
        self.scan_short_ints = None if short_ints is None else short_ints.scan_once  # type: ignore[attr-defined]
        #: Objects and arrays still allowed (counted as they are parsed).
        self.containers_left = self.n if max_containers is None else max_containers
        self.scan = decoder.scan_once  # type: ignore[attr-defined]  # set by JSONDecoder.__init__
        self.window_at, self.window = 0, ""  # a slice shared by the small values that follow each other

    def parse(self) -> Any:
        value, pos = self.value(self.skip(0), 1)
        pos = self.skip(pos)
        if pos != self.n:
            raise JSONDecodeError("Extra data", self.text, pos)
        return value

    def at(self, pos: int) -> str:
        return self.text[pos] if pos < self.n else ""

    def skip(self, pos: int) -> int:
        while True:
            limit = min(pos + SLICE, self.n)
            end = _run_end(_WHITESPACE, self.text, pos, limit)
            if end < limit or limit == self.n:
                return end
            pos = end

    def value(self, pos: int, level: int) -> tuple[Any, int]:
        """The value at ``pos``, a container there being at nesting ``level``; (value, end)."""
        first = self.at(pos)
        if first == '"':
            return self.string(pos)
        if first not in ("[", "{"):
            return self.scalar(pos)
        whole = self.small(pos, level)
        if whole is not None:
            return whole
        if level > self.max_depth:
            raise TooDeep
        self.spend(1)
        return self.array(pos, level) if first == "[" else self.object(pos, level)

    def small(self, pos: int, level: int) -> tuple[Any, int] | None:
        """The value at ``pos`` scanned in one slice, or None when it does not fit (or is invalid there)."""
        if not 0 <= pos - self.window_at <= SLICE // 2:
            self.slide(pos)
        found = self.scan_window(pos, level)
        if found is None and self.window_at != pos:
            self.slide(pos)
            found = self.scan_window(pos, level)
        return found

    def slide(self, pos: int) -> None:
        self.window_at, self.window = pos, self.text[pos : pos + SLICE]

    def scan_window(self, pos: int, level: int) -> tuple[Any, int] | None:
        start = pos - self.window_at
        try:
            value, end = self.scan(self.window, start)
        except _SCAN_FAILED:
            return None
        if end == len(self.window) and self.window_at + end < self.n:
            return None  # cut by the slice's end: an array or object would not have parsed, a number might
        self.check_depth(value, level, self.window, start, end)
        return value, self.window_at + end

    def check_depth(self, value: Any, level: int, source: str, start: int, end: int, wrapped: bool = False) -> int:
        """Refuse ``value`` (its text ``source[start:end]``), a container at ``level``, if it nests too deep
        or brings the containers past the bound; ``wrapped``: ``value`` is a batch's wrapper, not counted.
        The brackets in that text (the wrapper's included)."""
        brackets = source.count("[", start, end) + source.count("{", start, end)
        if not brackets:
            return 0
        room = self.max_depth - level + 1
        if brackets > room and nesting_exceeds(value, room):
            raise TooDeep
        if not (wrapped and brackets == 1):  # the wrapper's own; brackets in strings are text: count them
            self.spend(containers_in(value, self.containers_left + wrapped) - wrapped)
        return brackets

    def spend(self, containers: int) -> None:
        self.containers_left -= containers
        if self.containers_left < 0:
            raise TooManyContainers

    def batch(self, pos: int, level: int, opening: str, closing: str) -> tuple[Any, int, bool] | None:
        """Members from ``pos`` (a member's start) to the last comma between members in the next slice;
        (members, end, whether their text has a bracket)."""
        cut = self.text.rfind(",", pos, min(pos + SLICE, self.n))
        if cut <= pos:
            return None
        chunk = opening + self.text[pos:cut] + closing
        scan = self.scan
        if self.scan_short_ints is not None and _LONG_DIGIT_RUN.search(self.text, pos, cut) is None:
            scan = self.scan_short_ints
        try:
            members, end = scan(chunk, 0)
        except _SCAN_FAILED:
            return None
        if end != len(chunk):
            return None
        brackets = self.check_depth(members, level, chunk, 0, end, wrapped=True)
        return members, cut, brackets > 1

    def array(self, pos: int, level: int) -> tuple[list[Any], int]:
        out: list[Any] = []
        try:
            return self.fill_array(out, pos, level)
        except BaseException:
            # a refused body: what was parsed of this array is freed here, a slice at a time (at once, the
            # 65,536 arrays of a body refused at the container limit held the GIL for 12 ms), not by
            # whoever drops the exception's traceback
            empty_in_slices(out)
            raise

    def fill_array(self, out: list[Any], pos: int, level: int) -> tuple[list[Any], int]:
        pos = self.skip(pos + 1)
        if self.at(pos) == "]":
            return out, pos + 1
        batch_from = pos
        plain = True  # no object or array among the items
        while True:
            got = self.batch(pos, level, "[", "]") if pos >= batch_from else None
            if got is not None:
                items, pos, bracketed = got
                out.extend(items)
                plain = plain and not bracketed
                _give_gil()  # see YIELD
            else:
                if pos >= batch_from:  # no batch here: one slice of members, one by one, before the next try
                    batch_from = pos + SLICE
                item, pos = self.value(pos, level + 1)
                out.append(item)
                plain = plain and not isinstance(item, (list, dict))
                pos = self.skip(pos)
                if self.at(pos) == "]":
                    if self.long_list is not None and len(out) >= LONG_LIST:
                        self.long_list(out, plain)
                    return out, pos + 1
                if self.at(pos) != ",":
                    raise JSONDecodeError("Expecting ',' delimiter", self.text, pos)
            pos = self.skip(pos + 1)

    def object(self, pos: int, level: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        pos = self.skip(pos + 1)
        if self.at(pos) == "}":
            return out, pos + 1
        batch_from = pos
        while True:
            got = self.batch(pos, level, "{", "}") if pos >= batch_from else None
            if got is not None:
                members, pos, _ = got
                out.update(members)  # a repeated key keeps its first place and its last value, as json's
                _give_gil()  # see YIELD
            else:
                if pos >= batch_from:
                    batch_from = pos + SLICE
                if self.at(pos) != '"':
                    raise JSONDecodeError("Expecting property name enclosed in double quotes", self.text, pos)
                key, pos = self.string(pos)
                pos = self.skip(pos)
                if self.at(pos) != ":":
                    raise JSONDecodeError("Expecting ':' delimiter", self.text, pos)
                out[key], pos = self.value(self.skip(pos + 1), level + 1)
                pos = self.skip(pos)
                if self.at(pos) == "}":
                    return out, pos + 1
                if self.at(pos) != ",":
                    raise JSONDecodeError("Expecting ',' delimiter", self.text, pos)
            pos = self.skip(pos + 1)

    def string(self, pos: int) -> tuple[str, int]:
        """The string whose opening quote is at ``pos``; a long one in slices cut between whole escapes."""
        whole = self.small(pos, 1)
        if whole is not None:
            return whole
        text, parts, start = self.text, [], pos + 1
        while True:
            limit = min(start + SLICE, self.n)
            end = _run_end(_STRING_BODY, text, start, limit)
            closed = end < self.n and text[end] == '"'
            if not closed:
                if end >= self.n:
                    raise JSONDecodeError("Unterminated string starting at", text, pos)
                if end < limit - 6 or limit == self.n:  # stopped short of the slice's end by a bad character
                    message = "Invalid \\escape" if text[end] == "\\" else "Invalid control character at"
                    raise JSONDecodeError(message, text, end)
                if _HIGH_SURROGATE_ESCAPE.fullmatch(text, end - 6, end):  # keep a pair's halves together
                    end = _run_end(_STRING_BODY, text, start, end - 1)
            parts.append(self.scan('"' + text[start:end] + '"', 0)[0])
            if closed:
                return "".join(parts), end + 1
            start = end

    def scalar(self, pos: int) -> tuple[Any, int]:
        """A number, true, false or null (at most ``MAX_NUMBER_CHARS`` characters)."""
        piece = self.text[pos : pos + MAX_NUMBER_CHARS + 1]
        try:
            value, end = self.scan(piece, 0)
        except StopIteration:
            raise JSONDecodeError("Expecting value", self.text, pos) from None
        if end > MAX_NUMBER_CHARS:
            raise JSONDecodeError(f"Number longer than {MAX_NUMBER_CHARS} characters", self.text, pos)
        return value, pos + end


#: ``top_level_strings`` gives up after this many strings and escaped quotes (its only Python-speed steps).
TOP_LEVEL_STEPS = 100_000


def top_level_strings(text: str, keys: frozenset[str]) -> dict[str, str]:
    """The string members named in ``keys`` of the object that ``text`` opens, found without parsing
    the rest: what a refused body (too deep, too many containers) can still say about itself, such
    as a batch line's ``custom_id`` after its ``body``.

    It hops from one quote to the next (``str.find``) and counts the brackets between two strings
    (``str.count``), so its Python-speed steps are the strings and escaped quotes in ``text``: after
    ``TOP_LEVEL_STEPS`` of them it gives up with what it found.
    """
    found: dict[str, str] = {}
    start = _run_end(_WHITESPACE, text, 0, len(text))
    if not text.startswith("{", start):
        return found
    depth, pos, steps = 0, start, 0
    while steps < TOP_LEVEL_STEPS:
        quote = text.find('"', pos)
        segment_end = len(text) if quote < 0 else quote
        depth, steps = _depth_after(text, pos, segment_end, depth, steps)
        if quote < 0 or depth <= 0:  # the text ended, or the top-level object did
            return found
        end, steps = _string_end(text, quote, steps)
        if end < 0:
            return found
        if depth == 1 and end - quote <= 2 + max(map(len, keys), default=0):  # a short string at the top: a key?
            colon = _run_end(_WHITESPACE, text, end, len(text))
            value = _run_end(_WHITESPACE, text, colon + 1, len(text)) if text.startswith(":", colon) else -1
            if value >= 0 and text.startswith('"', value):
                value_end, steps = _string_end(text, value, steps)
                if value_end < 0:
                    return found
                key = _decoded(text[quote:end])
                if key in keys:  # a repeated key: its last value, as json.loads keeps
                    decoded = _decoded(text[value:value_end])
                    if decoded is not None:
                        found[key] = decoded
                end = value_end
        pos = end
    return found


_BRACKET = re.compile(r"[\[\]{}]")


def _depth_after(text: str, start: int, end: int, depth: int, steps: int) -> tuple[int, int]:
    """The nesting after ``text[start:end]`` (no strings in it) from ``depth``, or 0 where it reaches 0
    on the way; (depth, steps). Counted, unless enough closing brackets to reach 0 are there: walked."""
    closes = text.count("}", start, end) + text.count("]", start, end)
    if depth - closes > 0:
        return depth + text.count("{", start, end) + text.count("[", start, end) - closes, steps
    for bracket in _BRACKET.finditer(text, start, end):
        steps += 1
        depth += 1 if bracket.group() in "[{" else -1
        if depth <= 0 or steps >= TOP_LEVEL_STEPS:
            return 0, steps
    return depth, steps


def _string_end(text: str, quote: int, steps: int) -> tuple[int, int]:
    """(the index after the string that opens at ``quote``, or -1 when it is not closed; steps taken)."""
    pos = quote + 1
    while steps < TOP_LEVEL_STEPS:
        steps += 1
        close = text.find('"', pos)
        if close < 0:
            return -1, steps
        inside = text[pos:close]  # each character is sliced once: the pieces do not overlap
        if (len(inside) - len(inside.rstrip("\\"))) % 2 == 0:  # an even run of backslashes escapes itself
            return close + 1, steps
        pos = close + 1
    return -1, steps


def _decoded(literal: str) -> str | None:
    try:
        value = json.loads(literal)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
