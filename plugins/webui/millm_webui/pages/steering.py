"""``/ui/steering``: the registered SAEs (register, attach, detach, forget), their feature labels
(import, search), the live steering values (what is applied now, set and clear), and the saved
profiles (activate, deactivate, delete); features are shown with their labels."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ..render import Page

#: Labels one search shows.
LABELS_SHOWN = 50


async def load(api, req) -> dict[str, Any]:
    saes = await api.get("/api/saes")
    return {
        "available": saes.ok,
        "error": None if saes.ok else saes.error,
        "saes": saes.data.get("data", []) if saes.ok else [],
        "steering": await api.data("/api/steering", default={}),
        "profiles": (await api.data("/api/profiles", default={"data": []}))["data"],
        **await _labels(api, req),
    }


async def _labels(api, req) -> dict[str, Any]:
    """A label search (``?labels_sae=…&q=…``), through ``GET /api/saes/{sae_id}/labels``."""
    sae_id, q = req.get_param("labels_sae"), req.get_param("q")
    if not sae_id:
        return {"labels_sae": None, "labels_q": None, "labels": [], "labels_more": False, "labels_error": None}
    params: dict[str, Any] = {"limit": LABELS_SHOWN}
    if q:
        params["q"] = q
    found = await api.get(f"/api/saes/{quote(sae_id, safe='')}/labels", params)
    return {
        "labels_sae": sae_id,
        "labels_q": q,
        "labels": found.data.get("data", []) if found.ok else [],
        "labels_more": bool(found.ok and found.data.get("has_more")),
        "labels_error": None if found.ok else found.error,
    }


PAGE = Page("/ui/steering", "Steering", "steering.html", load, "SAEs, live values and profiles")
