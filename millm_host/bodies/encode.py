"""Encode a large response body as JSON in bounded pieces, so no one C call holds the GIL for long (issue 11 §0).

``json.dumps`` encodes a whole value in one C call: the body of 256 embeddings of
a 576-wide model (147k floats) held the GIL about 90 ms, a 4,096-wide model's
several hundred, and the event loop, which Falcon's ``resp.media`` encodes on,
answered nothing meanwhile. ``encoded`` gives the bytes ``json.dumps`` would (with
``ensure_ascii=False``, as Falcon's handler calls it), but hands ``json.dumps`` only
values of at most about ``BUDGET`` scalars; a larger list is cut into slices and a
larger object into its members, and the pieces are joined. Run it on a worker
thread: between two pieces the interpreter lets the event loop run.
``PiecewiseJSONHandler`` is the app's response handler for JSON: every
``resp.media`` of the host and of every plugin is encoded this way, on a worker
thread when it is large.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import partial
from typing import Any

import falcon.media

#: Scalars (and about 256 characters of string each) one ``json.dumps`` call may encode: well under a ms.
BUDGET = 2048
#: List items looked at per slice.
SLICE = 1024
#: Characters of one string one ``json.dumps`` call encodes.
STRING_SLICE = 64 * 1024

_dumps = partial(json.dumps, ensure_ascii=False)
_compact_dumps = partial(json.dumps, separators=(",", ":"), ensure_ascii=False)


class PiecewiseJSONHandler(falcon.media.JSONHandler):
    """Falcon's JSON handler, but a response body larger than ``BUDGET`` is encoded in pieces on a worker thread."""

    def __init__(self) -> None:
        super().__init__()
        self.serialize_async = self._serialize_in_pieces  # type: ignore[method-assign]

    async def _serialize_in_pieces(self, media: Any, content_type: str | None) -> bytes:
        if _left_after(media, BUDGET) >= 0:  # small: at once, on the loop (the walk stops at the budget)
            return _dumps(media).encode()
        return await asyncio.to_thread(encoded, media)


def is_large(value: Any) -> bool:
    """Whether ``value`` is more than one piece: encode it with ``encoded`` on a worker thread."""
    return _left_after(value, BUDGET) < 0


def encoded(value: Any, *, compact: bool = False) -> bytes:
    """``json.dumps(value, ensure_ascii=False).encode()`` (``compact``: with ``separators=(",", ":")``), in pieces."""
    dumps, item = (_compact_dumps, b",") if compact else (_dumps, b", ")
    parts: list[bytes] = []
    _encode(value, parts, lambda v: dumps(v).encode(), item)
    return b"".join(parts)  # a copy of the bytes, no encoding work: a few ms for tens of MB


def _encode(value: Any, parts: list[bytes], dumps: Callable[[Any], bytes], item: bytes) -> None:
    if _left_after(value, BUDGET) >= 0:
        parts.append(dumps(value))
    elif isinstance(value, dict):
        parts.append(b"{")
        for index, (key, member) in enumerate(value.items()):
            # the key as json.dumps writes it (a non-string key becomes a string), with its colon
            parts.append((item if index else b"") + dumps({key: None})[1:-5])
            _encode(member, parts, dumps, item)
        parts.append(b"}")
    elif isinstance(value, list | tuple):
        parts.append(b"[")
        for start in range(0, len(value), SLICE):
            piece = value[start : start + SLICE]
            if _left_after(piece, BUDGET) >= 0:
                parts.append((item if start else b"") + dumps(piece)[1:-1])
                continue
            for index, member in enumerate(piece):
                if index or start:
                    parts.append(item)
                _encode(member, parts, dumps, item)
        parts.append(b"]")
    elif isinstance(value, str) and len(value) > STRING_SLICE:
        # escaping is per character, so slices encode to the whole's text; one call over a 3.4 MB string
        # (/detokenize of 500,000 ids) held the GIL 16-23 ms
        parts.append(b'"')
        for start in range(0, len(value), STRING_SLICE):
            parts.append(dumps(value[start : start + STRING_SLICE])[1:-1])
        parts.append(b'"')
    else:
        parts.append(dumps(value))


def _left_after(value: Any, budget: int) -> int:
    """``budget`` less the scalars in ``value`` (long strings count per 256 characters); negative: over it.

    The walk stops as soon as the budget is spent, so it costs at most about ``budget`` steps.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            budget -= 1
            if len(item) > budget:
                return -1
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            budget -= 1
            if len(item) > budget:
                return -1
            stack.extend(item)
        elif isinstance(item, str):
            budget -= 1 + len(item) // 256
        else:
            budget -= 1
        if budget < 0:
            return budget
    return budget
