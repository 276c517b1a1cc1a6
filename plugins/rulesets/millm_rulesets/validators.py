"""Check-digit and shape validators over a matched span's text.

Separators (spaces, dashes, dots) are ignored: a card number or an IBAN is
written in groups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

_SEPARATORS = str.maketrans("", "", " -.\u00a0")


def compact(text: str) -> str:
    return text.translate(_SEPARATORS)


def luhn(text: str, _options: Mapping[str, Any]) -> bool:
    """The Luhn (mod 10) check over the span's digits (at least two, nothing but digits and separators)."""
    digits = compact(text)
    if len(digits) < 2 or not digits.isascii() or not digits.isdigit():
        return False
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def mod97(text: str, _options: Mapping[str, Any]) -> bool:
    """ISO 13616 (IBAN): two letters, two check digits, then letters and digits; mod 97 of the
    rearranged number is 1."""
    iban = compact(text).upper()
    if not (5 <= len(iban) <= 34) or not iban.isascii() or not iban.isalnum():
        return False
    if not (iban[:2].isalpha() and iban[2:4].isdigit()):
        return False
    rearranged = iban[4:] + iban[:4]
    number = "".join(str(int(ch, 36)) for ch in rearranged)
    return int(number) % 97 == 1


def length_prefix_table(text: str, options: Mapping[str, Any]) -> bool:
    """The span (separators left out, upper-cased) starts with a prefix of ``table`` and has that
    prefix's length; the longest matching prefix decides."""
    value = compact(text).upper()
    table: Mapping[str, int] = options["table"]
    for prefix in sorted(table, key=len, reverse=True):
        if value.startswith(prefix.upper()):
            return len(value) == table[prefix]
    return False


VALIDATORS: dict[str, Callable[[str, Mapping[str, Any]], bool]] = {
    "luhn": luhn,
    "mod97": mod97,
    "length_prefix_table": length_prefix_table,
}
