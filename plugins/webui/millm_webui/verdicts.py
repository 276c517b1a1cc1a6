"""What a result decided, in one place for every page: a probe's ``verdict``, or a rule's ``fires``.

A rule result carries ``fires`` and a ``count`` and never a ``verdict``; read as a probe's it would
show as undecided. A pending rule (``fires: null``) and any result that was not judged say their
outcome and reason instead.
"""

from __future__ import annotations

from typing import Any


def decided(result: dict[str, Any]) -> bool | None:
    """True (fired), False (judged, did not fire) or None (no decision: no bar, skipped, pending…)."""
    if result.get("kind") == "rule":
        fires = result.get("fires")
        return fires if isinstance(fires, bool) else None
    verdict = result.get("verdict")
    return verdict if isinstance(verdict, bool) else None


def verdict_word(result: dict[str, Any]) -> str:
    """``fired``, ``quiet`` (a probe), ``not fired`` (a rule), or the outcome and its reason."""
    decision = decided(result)
    if decision is None:
        reason = result.get("reason")
        return f"{result.get('outcome', 'unknown')}{': ' + reason if reason else ''}"
    if result.get("kind") == "rule":
        return f"fired · count {result.get('count')}" if decision else "not fired"
    return "fired" if decision else "quiet"
