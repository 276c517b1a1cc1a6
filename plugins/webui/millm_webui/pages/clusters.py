"""``/ui/clusters``: import a cluster (``mi.cluster/v1``); each with its features, activation and the
dial (the persistent intensity λ, within its bounds)."""

from __future__ import annotations

from typing import Any

from ..render import Page


async def load(api, req) -> dict[str, Any]:
    clusters = await api.get("/api/clusters")
    return {
        "available": clusters.ok,
        "error": None if clusters.ok else clusters.error,
        "clusters": clusters.data.get("data", []) if clusters.ok else [],
    }


PAGE = Page("/ui/clusters", "Clusters", "clusters.html", load, "imported clusters and their dials")
