"""``/ui/rule-sets``: import a rule set (``mi.ruleset/v1``), the imported sets with their status and
the behaviour each is attached to, attach and detach, try a set on text, and the rule signals
recorded beside armed probes (their results, no text)."""

from __future__ import annotations

from typing import Any

from ..render import Page


async def load(api, req) -> dict[str, Any]:
    sets = await api.get("/api/rule-sets")
    behaviours = await api.data("/api/probes/behaviours", default={"data": []})
    events = await api.data("/api/probes/events", {"limit": 200}, default={"data": []})
    return {
        "available": sets.ok,
        "error": None if sets.ok else sets.error,
        "sets": sets.data.get("data", []) if sets.ok else [],
        "behaviours": [b["key"] for b in behaviours["data"]],
        "rule_results": [r for r in events["data"] if r.get("kind") == "rule"],
    }


PAGE = Page("/ui/rule-sets", "Rule sets", "rulesets.html", load, "import rule sets; rule signals beside probes")
