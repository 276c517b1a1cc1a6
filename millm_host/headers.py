"""RFC 8941 structured header values, serialised by http-sfv (never by hand)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import http_sfv

Token = http_sfv.Token


def item(value: Any, params: Mapping[str, Any] | None = None) -> http_sfv.Item:
    """An RFC 8941 Item; a ``Token`` value stays a token, ``True`` params serialise bare."""
    it = http_sfv.Item(value)
    for key, param in (params or {}).items():
        if param is not None:
            it.params[key] = param
    return it


def serialize_item(value: Any, params: Mapping[str, Any] | None = None) -> str:
    return str(item(value, params))


def serialize_list(items: Iterable[http_sfv.Item]) -> str:
    structured = http_sfv.List()
    structured.extend(items)
    return str(structured)


def serialize_string_list(values: Iterable[str]) -> str:
    return serialize_list(http_sfv.Item(v) for v in values)


def parse_list(value: str) -> http_sfv.List:
    parsed = http_sfv.List()
    parsed.parse(value.encode("ascii"))
    return parsed
