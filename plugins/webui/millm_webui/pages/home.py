"""``/ui``: what is running (``/api/health``) and where to go."""

from __future__ import annotations

from typing import Any

from ..render import Page


async def load(api, req) -> dict[str, Any]:
    return {"health": await api.data("/api/health", default={})}


PAGE = Page("/ui", "Overview", "home.html", load)
