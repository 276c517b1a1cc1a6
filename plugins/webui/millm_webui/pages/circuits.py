"""``/ui/circuits``: import a circuit (``mi.circuit/v1``); each with its rung (and the rung's words),
its members, the dial, activation, and what an active circuit really steers now."""

from __future__ import annotations

from typing import Any

from ..render import Page


async def load(api, req) -> dict[str, Any]:
    circuits = await api.get("/api/circuits")
    active = await api.data("/api/circuits/active", default={"data": []})
    return {
        "available": circuits.ok,
        "error": None if circuits.ok else circuits.error,
        "circuits": circuits.data.get("data", []) if circuits.ok else [],
        "steering": {c["circuit_id"]: c.get("steering") for c in active["data"]},
    }


PAGE = Page("/ui/circuits", "Circuits", "circuits.html", load, "imported circuits, their rungs and dials")
