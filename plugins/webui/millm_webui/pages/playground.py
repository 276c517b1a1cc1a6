"""``/ui/playground``: chat with the served model, steered and unsteered side by side, with what the
armed probes and rule signals saw. The page carries the choices (SAEs, profiles, clusters, circuits);
``static/playground.js`` sends the chat request from the browser and draws the replies."""

from __future__ import annotations

from typing import Any

from ..render import Page


async def load(api, req) -> dict[str, Any]:
    health = await api.data("/api/health", default={})
    saes = await api.get("/api/saes")
    return {
        "model": health.get("model"),
        "status": health.get("status"),
        "saes_available": saes.ok,
        "saes_error": None if saes.ok else saes.error,
        "saes": [s for s in (saes.data.get("data", []) if saes.ok else []) if s.get("attached")],
        "registered": len(saes.data.get("data", [])) if saes.ok else 0,
        "profiles": [
            p for p in (await api.data("/api/profiles", default={"data": []}))["data"] if not p.get("cluster_id")
        ],
        "clusters": (await api.data("/api/clusters", default={"data": []}))["data"],
        "circuits": (await api.data("/api/circuits", default={"data": []}))["data"],
    }


PAGE = Page("/ui/playground", "Playground", "playground.html", load, "chat, steer, and see what the probes see")
