"""A request body's bytes to a JSON object: UTF-8, finite numbers, bounded nesting, valid Unicode, in slices.

Linear in the body, and no one C call decodes, scans or searches more than a slice
(``bodies.parse``), so a worker thread reading 4 MiB lets the event loop run.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from typing import Any

from ..errors import InvalidParameter
from . import collector, release
from .parse import SLICE, TooDeep, TooManyContainers, loads_in_slices


def _refuse_constant(name: str) -> Any:
    raise InvalidParameter(f"{name} is not valid JSON; numbers must be finite", param=None)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidParameter(f"number {text[:40]} is out of range", param=None)
    return value


MAX_JSON_INTEGER = 2**63


def _bounded_int(text: str) -> int:
    """Integers past 64 bits mean nothing to any field; refusing them here spares every reader."""
    if len(text.lstrip("-")) > 19 or abs(value := int(text)) > MAX_JSON_INTEGER:
        raise InvalidParameter(f"integer {text[:40]}{'…' if len(text) > 40 else ''} is out of range", param=None)
    return value


class BodyRefused(InvalidParameter):
    """A body refused while it was parsed (nesting or containers past their bound).

    What it still says of itself (a batch line's ``custom_id``): ``jsonslices.top_level_strings``.
    """


def parse_json_body(raw: bytes, max_depth: int, max_containers: int | None = None) -> dict[str, Any]:
    """Parse a request body: UTF-8 JSON object, finite numbers, bounded nesting and containers, valid Unicode.

    Linear in the body, and in slices (``jsonslices``): no one C call decodes,
    scans or searches more than a slice, so a worker thread parsing 4 MiB lets
    the event loop run every few ms. The nesting, and the number of objects and
    arrays (``max_containers``, None: unbounded), are bounded while parsing. A
    ``\\uD800``-style escape without its pair decodes to a lone surrogate, which no
    tokenizer, database or header can take: it is refused here, naming where it
    is. Call it off the event loop for large bodies (``resources.common.parse_json``).
    """
    text = _decoded(raw)
    refusal: str | None = None
    try:
        with collector.paused():
            body = loads_in_slices(
                text, _BODY_DECODER, max_depth, max_containers, _SHORT_INTS_DECODER, long_list=held_apart
            )
    except json.JSONDecodeError as exc:
        refusal = f"the request body is not valid JSON: {exc.msg} (character {exc.pos})"
    except (TooDeep, RecursionError):
        refusal = f"the request body nests deeper than {max_depth} levels"
    except TooManyContainers:
        refusal = (
            f"the request body holds more than {max_containers} JSON objects and arrays (MILLM_MAX_JSON_CONTAINERS)"
        )
    if refusal is not None:
        # Raised here, not in the handler: the parser's exception (its traceback's frames hold the text and
        # what was parsed of it) is gone by now, freed on this thread, not kept alive by the 400 as its context.
        raise BodyRefused(refusal)
    if not isinstance(body, dict):
        raise InvalidParameter("the request body must be a JSON object")
    if _has_surrogate_escape(raw):
        where = lone_surrogate_at(body)
        if where is not None:
            raise InvalidParameter(
                f"{where} holds a lone surrogate (a \\uD800-\\uDFFF escape without its pair); "
                "text must be valid Unicode",
                param=where,
            )
    return body


def held_apart(items: list[Any], plain: bool) -> None:
    """A long parsed list: out of the collector's sight when it holds only scalars, and freed by the release."""
    if plain:
        collector.untrack_plain(items)
    release.keep(items)


_BODY_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int)
#: The same, for text with no integer of 19 digits or more: none is out of range (``_bounded_int``).
_SHORT_INTS_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
#: Bytes one C call decodes or searches (a slice of ``jsonslices``' size, for 4-byte characters).
_BYTES_SLICE = 4 * SLICE


def _decoded(raw: bytes) -> str:
    """``raw`` as UTF-8, a slice at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    parts = []
    for start in range(0, len(raw) + 1, _BYTES_SLICE):
        pending = len(decoder.getstate()[0])  # bytes of a character the last slice cut
        try:
            parts.append(decoder.decode(raw[start : start + _BYTES_SLICE], final=start + _BYTES_SLICE > len(raw)))
        except UnicodeDecodeError as exc:
            raise InvalidParameter(
                f"the request body is not valid UTF-8 (byte {start - pending + exc.start})"
            ) from None
    return "".join(parts)


def _has_surrogate_escape(raw: bytes) -> bool:
    """Whether ``raw`` holds a \\uD800-\\uDFFF escape, searched a slice at a time (slices overlap by 5 bytes)."""
    return any(
        _SURROGATE_ESCAPE.search(raw, start, start + _BYTES_SLICE + 5) is not None
        for start in range(0, len(raw), _BYTES_SLICE)
    )


#: Every lone surrogate comes from such an escape (raw UTF-8 cannot hold one): bodies without it skip the walk.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def lone_surrogate_at(value: Any) -> str | None:
    """Where the first string (or key) holding a lone surrogate is (``messages[0].content``); None if none."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, str):
            if not _encodable(node):
                return where or "body"
        elif isinstance(node, dict):
            for key, child in reversed(node.items()):
                if not _encodable(key):
                    return f"a key of {where or 'the body'}"
                stack.append((f"{where}.{key}" if where else key, child))
        elif isinstance(node, list):
            stack.extend((f"{where}[{i}]", child) for i, child in reversed(list(enumerate(node))))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
