"""``/ui/settings``: Settings → Environment, every declared setting in force (``GET /api/settings``):
its value, default and meaning; secrets only as set or not. Settings are read at start."""

from __future__ import annotations

from typing import Any

from ..render import Page


def group_of(name: str) -> str:
    """``PROBE_TRANSCRIPTS`` → ``PROBE``: settings listed by their prefix."""
    return name.split("_", 1)[0]


def shown(value: Any) -> str:
    """A setting's value as text (the template escapes it)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(map(str, value)) if value else "empty"
    return str(value)


async def load(api, req) -> dict[str, Any]:
    answer = await api.get("/api/settings")
    settings = answer.data.get("data", []) if answer.ok else []
    groups: dict[str, list[dict[str, Any]]] = {}
    for setting in settings:
        groups.setdefault(group_of(setting["name"]), []).append(setting)
    return {"groups": groups, "shown": shown, "error": None if answer.ok else answer.error}


PAGE = Page("/ui/settings", "Settings", "settings.html", load, "Environment: every setting in force")
