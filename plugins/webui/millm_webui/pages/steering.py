"""``/ui/steering``: the registered SAEs (register, attach, detach, forget), the live steering values
(what is applied now, set and clear), and the saved profiles (activate, deactivate, delete)."""

from __future__ import annotations

from typing import Any

from ..render import Page


async def load(api, req) -> dict[str, Any]:
    saes = await api.get("/api/saes")
    return {
        "available": saes.ok,
        "error": None if saes.ok else saes.error,
        "saes": saes.data.get("data", []) if saes.ok else [],
        "steering": await api.data("/api/steering", default={}),
        "profiles": (await api.data("/api/profiles", default={"data": []}))["data"],
    }


PAGE = Page("/ui/steering", "Steering", "steering.html", load, "SAEs, live values and profiles")
