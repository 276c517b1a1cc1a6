"""RFC 8941 structured header values, serialised by http-sfv (never by hand).

Every String that goes into a header through these helpers is percent-encoded
first (``percent_encode``): an RFC 8941 String holds printable ASCII only, so a
name with a quote, a backslash, a control character or a non-ASCII letter would
otherwise make http-sfv raise and turn a finished response into a 500. The
encoding is lossless: decode with ``urllib.parse.unquote``. Tokens, numbers and
booleans are passed through as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import http_sfv

Token = http_sfv.Token
Item = http_sfv.Item  # what ``item`` returns and ``serialize_list`` takes

_KEEP = frozenset(range(0x20, 0x7F)) - {ord("%"), ord('"'), ord("\\")}
_KEEP_CHARS = frozenset(map(chr, _KEEP))


def percent_encode(text: str) -> str:
    """Each UTF-8 byte outside %x20-7E, and each of ``%``, ``"``, ``\\``, as ``%XX`` (uppercase).

    A lone surrogate is encoded as the three bytes Python's ``surrogatepass``
    gives it, so no string makes this raise.
    """
    if _KEEP_CHARS.issuperset(text):
        return text
    return "".join(chr(b) if b in _KEEP else f"%{b:02X}" for b in text.encode("utf-8", "surrogatepass"))


def _encoded(value: Any) -> Any:
    return percent_encode(value) if isinstance(value, str) and not isinstance(value, Token) else value


def item(value: Any, params: Mapping[str, Any] | None = None) -> Item:
    """An RFC 8941 Item; Strings percent-encoded, a ``Token`` stays a token, ``True`` params serialise bare."""
    it = http_sfv.Item(_encoded(value))
    for key, param in (params or {}).items():
        if param is not None:
            it.params[key] = _encoded(param)
    return it


def serialize_item(value: Any, params: Mapping[str, Any] | None = None) -> str:
    return str(item(value, params))


def serialize_list(items: Iterable[Item]) -> str:
    structured = http_sfv.List()
    structured.extend(items)
    return str(structured)


def serialize_string_list(values: Iterable[str]) -> str:
    """A List of Strings, each percent-encoded."""
    return serialize_list(item(v) for v in values)


def parse_list(value: str) -> http_sfv.List:
    parsed = http_sfv.List()
    parsed.parse(value.encode("ascii"))
    return parsed
