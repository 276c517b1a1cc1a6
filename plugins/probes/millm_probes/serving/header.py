"""``X-miLLM-Probe-Verdicts``: an RFC 8941 list, one member per probe and window.

Serialised by http-sfv (decimals carry at most three fractional digits; the body
and the stream chunk carry full precision). Bounded by
``PROBE_VERDICT_HEADER_MAX_BYTES``: past it whole behaviours are left out and a
last member ``"...";truncated;total=<n>`` says how many results there were.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import Any

import http_sfv

from millm_host.api import Token, item, serialize_list

HEADER = "X-miLLM-Probe-Verdicts"
DECIMAL_LIMIT = 1e12  # RFC 8941 decimals have at most 12 integer digits


def _decimal(value: float | None) -> float | None:
    return value if value is not None and abs(value) < DECIMAL_LIMIT else None


def other_member(result: dict[str, Any]) -> http_sfv.Item:
    """Another plugin's result (hook ``monitor_results``): its name, kind, fires and count."""
    params: dict[str, Any] = {"kind": Token(result["kind"])}
    if result.get("fires") is not None:
        params["fires"] = bool(result["fires"])
    if isinstance(result.get("count"), int):
        params["count"] = result["count"]
    if result.get("reason") is not None:
        params["reason"] = Token(result["reason"])
    params["window"] = Token(result["window"])
    if result.get("behaviour") is not None:
        params["behaviour"] = result["behaviour"]
    return item(result["name"], params)


def member(result: dict[str, Any]) -> http_sfv.Item:
    """One result as a header member: the probe's name, then its reading as parameters."""
    if result.get("kind", "probe") != "probe":
        return other_member(result)
    params: dict[str, Any] = {}
    if result["score"] is not None and result["status"] == "final":
        params["score"] = _decimal(result["score"])
        params["threshold"] = _decimal(result["threshold"])
        params["verdict"] = result.get("verdict")
    else:
        params["scored"] = False
    if result["reason"] is not None:
        params["reason"] = Token(result["reason"])
    params["rung"] = result["rung"]
    params["window"] = Token(result["window"])
    params["behaviour"] = result["behaviour"]
    params["probe"] = result["probe_id"]
    block = result.get("set")
    if block is not None:  # how much of its behaviour's set produced results beside it
        params["set_armed"] = block["armed_members"]
        params["set_total"] = block["total_members"]
        params["complete"] = block["complete"]
    return item(result["name"], params)


def _group(result: dict[str, Any]) -> Any:
    """What is kept or left out whole: a behaviour's results; a probe naming none is a group of its own."""
    if result["behaviour"] is not None:
        return result["behaviour"]
    return ("probe", result["probe_id"]) if result.get("probe_id") else (result.get("kind"), result["name"])


def render(results: Sequence[dict[str, Any]], max_bytes: int) -> str:
    """The header value for ``results`` (already in listing order), within ``max_bytes``.

    Each member is serialised once (an RFC 8941 list is its members joined by ``", "``), so a set of
    thousands costs its members' serialisation and no more, with or without truncation."""
    members = [serialize_list([member(r)]) for r in results]
    full = ", ".join(members)
    if len(full) <= max_bytes:
        return full
    marker = serialize_list([item("...", {"truncated": True, "total": len(results)})])
    kept: list[str] = []
    size = len(marker)
    position = 0
    for _, group in groupby(results, key=_group):
        count = len(list(group))
        adding = members[position : position + count]
        grown = size + sum(len(m) + 2 for m in adding)  # each member and its ", "
        if grown > max_bytes:
            break
        kept += adding
        size = grown
        position += count
    return ", ".join([*kept, marker])
