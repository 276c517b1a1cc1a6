"""``/ui/probes``: Probe Monitors. Import a definition or Browse Hub (``static/hub.js``); behaviour groups with Arm (the dialog with the
gates and, below rung 2, the acknowledgement), Dry run and Disarm; on each probe's row Check parity (the
report, ``static/probes.js``) and Delete; each probe's results (N results · M fired over every stored
result, from ``/api/probes/events/counts``; filters for fired verdicts and one window) with the newest
listed and a score histogram of them against its threshold.
Nothing here shows prompt or reply text: that is only on the event detail page."""

from __future__ import annotations

from typing import Any

from ..charts import timeline
from ..histogram import histogram
from ..render import Page

WINDOWS = ("all", "prompt", "response", "last_user", "reasoning", "answer")
RESULTS_SHOWN = 200  # results listed per probe (the API pages by cursor; the page reads the newest)


def filters_of(req) -> dict[str, str]:
    """The filters in the page's query (a plain GET form, so they work without JavaScript)."""
    found = {}
    if req.get_param("fired") in ("true", "false"):
        found["fired"] = req.get_param("fired")
    if req.get_param("window") in WINDOWS:
        found["window"] = req.get_param("window")
    return found


async def load(api, req) -> dict[str, Any]:
    probes = (await api.data("/api/probes", default={"data": []}))["data"]
    behaviours = await api.data("/api/probes/behaviours", default={"data": [], "rearm": []})
    status = await api.data("/api/probes/status", default={"armed": []})
    filters = filters_of(req)
    # Every stored result counts, not only the newest RESULTS_SHOWN listed below (one query for all probes).
    counted = await api.data("/api/probes/events/counts", filters, default=None)
    totals = {c["probe_id"]: c for c in counted["data"]} if counted else None
    results, charts, thresholds = {}, {}, {}
    for probe in probes:
        answer = await api.data("/api/probes/events", {"probe_id": probe["id"], "limit": RESULTS_SHOWN, **filters})
        rows = (answer or {}).get("data", [])
        more = bool((answer or {}).get("has_more"))
        total = (totals or {}).get(probe["id"], {"results": 0, "fired": 0})
        results[probe["id"]] = {
            "rows": rows,
            "more": more,
            # without the counts (an older server): what the page lists, marked "+" when there are more
            "total": total["results"] if totals is not None else len(rows),
            "fired": total["fired"] if totals is not None else sum(1 for r in rows if r.get("fires")),
            "exact": totals is not None or not more,
        }
        scores = [r["score"] for r in rows if r.get("score") is not None]
        # A probe may carry no bar (decision null): its scores are drawn with no threshold.
        thresholds[probe["id"]] = (probe.get("decision") or {}).get("threshold")
        charts[probe["id"]] = histogram(scores, thresholds[probe["id"]])
    known = {p["id"] for p in probes}
    recent = await api.data("/api/probes/events", {"limit": RESULTS_SHOWN, **filters}, default={"data": []})
    others = [r for r in recent["data"] if r.get("kind") != "probe" or r.get("probe_id") not in known]
    quiet = {a["probe_id"]: a for a in status.get("armed", [])}
    by_behaviour: dict[str | None, list[dict[str, Any]]] = {}
    for probe in probes:
        by_behaviour.setdefault(probe["behaviour"], []).append(probe)
    # The lowest rung of each behaviour's members: below 2, arming asks for the acknowledgement.
    min_rungs = {
        key: min((p["rung"] for p in members if isinstance(p.get("rung"), int)), default=0)
        for key, members in by_behaviour.items()
        if key is not None
    }
    # Verdicts over time: each behaviour's members' listed results, and the other results (rules…).
    timelines = {
        key: timeline([r for p in members for r in results[p["id"]]["rows"]]) for key, members in by_behaviour.items()
    }
    return {
        "timelines": timelines,
        "others_timeline": timeline(others),
        "probes": probes,
        "groups": behaviours["data"],
        "rearm": behaviours.get("rearm", []),
        "by_behaviour": by_behaviour,
        "min_rungs": min_rungs,
        "status": status,
        "quiet": quiet,
        "results": results,
        "charts": charts,
        "thresholds": thresholds,
        "others": others,
        "filters": filters,
        "windows": WINDOWS,
    }


PAGE = Page("/ui/probes", "Probe Monitors", "probes.html", load, "import, arm and read probes")
