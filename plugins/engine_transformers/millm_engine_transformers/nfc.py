"""Which characters NFC may merge into the character before them, for a token bound (``token_span``).

NFC decomposes a text, then composes each starter with what follows it. A character
whose decomposition begins with a starter that is never the second of a composition
(Hangul's vowel and final jamo are; a few vowel signs of Indic scripts are) keeps a
character of its own: the starter itself, or the composite it begins. Every other
character (a combining mark, a composition's second character, a character Python's
Unicode database does not have, which a newer Unicode in the tokenizer may) may not.
``mergeable(text)`` counts the latter, so what is left is a true lower bound.

Characters past the third plane (``PLANES_READ``: mostly unassigned) all count as
mergeable: reading every code point took 0.8 s, the first three planes 0.08 s, once.
"""

from __future__ import annotations

import bisect
import functools
import re
import time
import unicodedata
from dataclasses import dataclass

#: Code points below this are looked at one by one.
PLANES_READ = 0x30000
#: Hangul vowel and final jamo: the second characters of Hangul's algorithmic composition.
_HANGUL_SECONDS = (range(0x1161, 0x1176), range(0x11A8, 0x11C3))
#: Characters one regular-expression call reads (a call holds the GIL: about a millisecond here).
_SLICE = 64 * 1024


def mergeable(text: str) -> int:
    """How many characters of ``text`` NFC may merge into the one before them (0 for ASCII)."""
    if text.isascii():
        return 0
    tables, count = _tables(), 0
    for start in range(0, len(text), _SLICE):
        if start:
            time.sleep(0)  # the GIL to the event loop between slices
        found = tables.outside_bmp_kept.findall(text, start, start + _SLICE)
        count += len(found) - sum(1 for char in found if char > "\uffff" and tables.keeps_past_bmp(char))
    return count


@dataclass(frozen=True)
class _Tables:
    #: Matches a character of the Basic Multilingual Plane that NFC may merge, or any past it: a class of
    #: the plane's kept characters alone is a bitmap to ``re``; ranges past it made the match 17 times slower.
    outside_bmp_kept: re.Pattern[str]
    #: Kept characters past the BMP, as sorted ranges (first and last code points).
    firsts: tuple[int, ...]
    lasts: tuple[int, ...]

    def keeps_past_bmp(self, char: str) -> bool:
        i = bisect.bisect_right(self.firsts, ord(char)) - 1
        return i >= 0 and ord(char) <= self.lasts[i]


@functools.cache
def _tables() -> _Tables:
    seconds = {cp for block in _HANGUL_SECONDS for cp in block}
    for cp in range(0x80, PLANES_READ):
        parts = unicodedata.decomposition(chr(cp)).split()
        if len(parts) == 2 and not parts[0].startswith("<"):
            seconds.add(int(parts[1], 16))
    kept: list[list[int]] = [[0, 0x7F]]  # ranges of characters that keep one of their own
    for cp in range(0x80, PLANES_READ):
        char = chr(cp)
        if unicodedata.category(char) == "Cn":
            continue
        first = unicodedata.normalize("NFD", char)[0]
        if unicodedata.combining(first) or ord(first) in seconds:
            continue
        if kept[-1][1] == cp - 1:
            kept[-1][1] = cp
        else:
            kept.append([cp, cp])
    bmp = [(a, min(b, 0xFFFF)) for a, b in kept if a <= 0xFFFF]
    past = [(max(a, 0x10000), b) for a, b in kept if b > 0xFFFF]
    ranges = "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" if a < b else re.escape(chr(a)) for a, b in bmp)
    return _Tables(re.compile(f"[^{ranges}]"), tuple(a for a, _ in past), tuple(b for _, b in past))
