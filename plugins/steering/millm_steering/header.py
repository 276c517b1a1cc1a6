"""``X-miLLM-Steering`` and ``X-miLLM-Steering-Intensity`` values, serialised by http-sfv.

The steering value is an RFC 8941 List: ``none``, ``unknown``, or one member per
applied entry (SAE items by layer, then SAE id), each a Token naming the kind
with its parameters in the spec's order. Booleans serialise bare (``changed``).
Every String (profile names, SAE ids) is percent-encoded by ``millm_host.headers``.
"""

from __future__ import annotations

from collections.abc import Sequence

from millm_host.api import Token, item, serialize_item, serialize_list

from .resolve import Entry

STEERING = "X-miLLM-Steering"
INTENSITY = "X-miLLM-Steering-Intensity"


def _member(entry: Entry, changed: bool) -> object:
    params: dict[str, object] = {}
    if entry.kind == "profile":
        params["name"] = entry.name or ""  # percent-encoded by item(), as every String is
        params["source"] = Token(entry.source or "request")
        params["intensity"] = repr(float(entry.intensity if entry.intensity is not None else 1.0))
    params["sae"] = entry.attachment.sae_id
    params["layer"] = entry.attachment.layer
    params["features"] = len(entry.applied.values)
    params["hash"] = entry.hash
    if entry.kind != "manual" and entry.applied.clamped:
        params["clamped"] = entry.applied.clamped
    if changed:
        params["changed"] = True
    return item(Token(entry.kind), params)


def steering_value(entries: Sequence[Entry], changed: bool) -> str:
    """The header value for what was applied; ``none`` when nothing was."""
    if not entries:
        return serialize_list([item(Token("none"), {"changed": True} if changed else None)])
    ordered = sorted(entries, key=lambda e: (e.attachment.layer, e.attachment.sae_id))
    return serialize_list([_member(e, changed) for e in ordered])


def unknown_value(reason: str, changed: bool = False) -> str:
    """The state could not be determined: ``unknown;reason=<token>`` (never omitted, never guessed)."""
    return serialize_list([item(Token("unknown"), {"reason": Token(reason), "changed": True if changed else None})])


def intensity_value(lam: float) -> str:
    """The resolved λ as a String holding the shortest round-tripping decimal (``repr``)."""
    return serialize_item(repr(float(lam)))
