"""``X-miLLM-Steering`` and ``X-miLLM-Steering-Intensity`` values, serialised by http-sfv.

The steering value is an RFC 8941 List: ``none``, ``unknown``, or one member per
circuit (by id) then one per other applied entry (SAE items by layer, then SAE id),
each a Token naming the kind with its parameters in the spec's order. Booleans
serialise bare (``changed``, ``composed``). Every String (profile names, SAE ids)
is percent-encoded by ``millm_host.headers``.

``X-miLLM-Circuit-Rung`` is an Item: the rung (an Integer) with its ladder phrase
as ``language``. It is sent only when a circuit is named in the steering value.
"""

from __future__ import annotations

from collections.abc import Sequence

from millm_host.api import Item, Token, item, serialize_item, serialize_list

from .documents import RUNG_LANGUAGE
from .resolve import Entry

STEERING = "X-miLLM-Steering"
INTENSITY = "X-miLLM-Steering-Intensity"
RUNG = "X-miLLM-Circuit-Rung"


def _circuit_members(entries: Sequence[Entry], changed: bool) -> list[Item]:
    """One member per circuit, by id; ``composed`` when one of its layers carries another circuit too."""
    by_circuit: dict[str, list[Entry]] = {}
    for entry in entries:
        if entry.kind == "circuit" and entry.circuit_id is not None:
            by_circuit.setdefault(entry.circuit_id, []).append(entry)
    layers: dict[int, set[str]] = {}
    for circuit_id, found in by_circuit.items():
        for entry in found:
            layers.setdefault(entry.attachment.layer, set()).add(circuit_id)
    members = []
    for circuit_id in sorted(by_circuit):
        found = by_circuit[circuit_id]
        composed = any(len(layers[e.attachment.layer]) > 1 for e in found)
        params = {
            "id": circuit_id,
            "intensity": repr(float(found[0].intensity if found[0].intensity is not None else 1.0)),
            "composed": True if composed else None,
            "changed": True if changed else None,
        }
        members.append(item(Token("circuit"), params))
    return members


def _member(entry: Entry, changed: bool) -> Item:
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
    circuits = _circuit_members(entries, changed)
    ordered = sorted(
        (e for e in entries if e.kind != "circuit"), key=lambda e: (e.attachment.layer, e.attachment.sae_id)
    )
    return serialize_list(circuits + [_member(e, changed) for e in ordered])


def rung_value(entries: Sequence[Entry]) -> str | None:
    """``X-miLLM-Circuit-Rung`` for what was applied: None unless a circuit is among it.

    With several circuits, the lowest rung among them: evidence language never claims more
    than the weakest circuit that steered.
    """
    rungs = [e.rung for e in entries if e.kind == "circuit" and e.rung is not None]
    if not rungs:
        return None
    rung = min(rungs)
    # the spec's own spelling, "2; language=...": RFC 8941 parsers take the space after ";"
    return serialize_item(rung, {"language": RUNG_LANGUAGE[rung]}).replace(";", "; ", 1)


def unknown_value(reason: str, changed: bool = False) -> str:
    """The state could not be determined: ``unknown;reason=<token>`` (never omitted, never guessed)."""
    return serialize_list([item(Token("unknown"), {"reason": Token(reason), "changed": True if changed else None})])


def intensity_value(lam: float) -> str:
    """The resolved λ as a String holding the shortest round-tripping decimal (``repr``)."""
    return serialize_item(repr(float(lam)))
