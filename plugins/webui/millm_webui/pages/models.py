"""``/ui/models``: every model with its state, Load/Unload, load progress, its LoRA adapters (added and
removed live, ``/api/models/{id}/adapters``), and each loaded model's Probe capacity panel
(``GET /api/models/{id}/probe-capacity``) with its budget drawn as a bar."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ..charts import budgets
from ..render import Page

HALVES = (("per_token", "per generated token"), ("per_1k_prompt", "per 1,000 prompt tokens"))


def used_percent(half: dict[str, Any]) -> float:
    """How much of the budget the armed set uses, for the bar (0–100; over 100 is drawn full, in red)."""
    budget = half.get("fillable_ms") or half.get("budget_ms") or 0
    return 100.0 * half.get("cost_ms", 0) / budget if budget else 0.0


async def load(api, req) -> dict[str, Any]:
    models = (await api.data("/api/models", default={"data": []}))["data"]
    health = await api.data("/api/health", default={})
    capacities, adapters = {}, {}
    for model in models:
        path = quote(model["id"], safe="")
        adapters[model["id"]] = (await api.data(f"/api/models/{path}/adapters", default={"data": []}))["data"]
        if model["state"] == "LOADED":
            capacities[model["id"]] = await api.data(f"/api/models/{quote(model['id'], safe='')}/probe-capacity")
    return {
        "models": models,
        "health": health,
        "capacities": capacities,
        "adapters": adapters,
        "halves": HALVES,
        "budget_chart": budgets,
        "used": used_percent,
    }


PAGE = Page("/ui/models", "Models", "models.html", load, "load a model; its LoRA adapters; each model's Probe capacity")
