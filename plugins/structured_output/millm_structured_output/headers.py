"""``X-miLLM-Constrained``: which constraint shaped the reply (RFC 8941, through http-sfv)."""

from __future__ import annotations

from millm_host.api import Token, serialize_item

from .response_format import ResponseFormat

HEADER = "X-miLLM-Constrained"


def constrained_header(fmt: ResponseFormat) -> str:
    """``json_object`` or ``json_schema;name="…"``."""
    return serialize_item(Token(fmt.kind), {"name": fmt.name} if fmt.name else None)
