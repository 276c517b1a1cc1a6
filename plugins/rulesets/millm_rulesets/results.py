"""Rule results: ``mi.probe.result/v1`` objects of ``kind: "rule"``, one per named expression and window.

They carry ``fires`` and ``count``, never the matched text. An undecided result
(skipped, failed, pending) has ``fires: null`` and ``count: 0``: check ``status``
(or ``fires``) before trusting ``count``. Each carries its behaviour's ``set``
block (the probes' set, as the probes plugin hands it over in ``MonitoredRequest.sets``),
so a rule result says what a probe result of its behaviour says about the blend.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypedDict

import uuid6

from .evaluate import Outcome, Undecided

if TYPE_CHECKING:
    from .runtime import Loaded

SCHEMA = "mi.probe.result/v1"


class RequestFields(TypedDict):
    """``rule_result``'s keywords that every result of one monitored request shares."""

    behaviour: str
    request_id: str | None
    trace_id: str
    span_id: str
    persistence: str
    set_block: dict[str, Any] | None


class WhyUndecided(TypedDict, total=False):
    """``rule_result``'s keywords for a result that was never evaluated."""

    reason: str | None
    result_outcome: str | None
    status: str | None


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def rule_result(
    loaded: Loaded,
    name: str,
    window: str | None,
    outcome: Outcome | None,
    *,
    reason: str | None = None,
    result_outcome: str | None = None,
    status: str | None = None,
    behaviour: str | None = None,
    request_id: str | None = None,
    trace_id: str | None = None,
    span_id: str | None = None,
    persistence: str = "persisted",
    set_block: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The result of expression ``name``; ``outcome`` None means undecided (``reason`` says why)."""
    decided = outcome is not None
    return _result(
        {"version": loaded.version, "rule_set_id": loaded.id, "ruleset_id": loaded.ruleset_id},
        loaded.digest,
        name,
        window,
        outcome=result_outcome or ("completed" if decided else "failed"),
        reason=reason,
        status=status or ("final" if decided else "unavailable"),
        fires=outcome.fires if outcome is not None else None,
        count=outcome.count if outcome is not None else 0,
        behaviour=behaviour,
        request_id=request_id,
        trace_id=trace_id,
        span_id=span_id,
        persistence=persistence,
        set_block=set_block,
    )


def not_attached(
    rule_set_id: str,
    window: str,
    *,
    behaviour: str,
    request_id: str | None,
    trace_id: str,
    span_id: str,
    persistence: str,
    set_block: dict[str, Any] | None,
) -> dict[str, Any]:
    """The one result of a window whose behaviour names a rule set this process does not have (deleted, or
    attached by another process and not loaded here): the rules are unknown, so the probes decide alone.

    Named after the set (its expressions are unknown), ``skipped`` / ``rule_set_not_attached``."""
    return _result(
        {"version": None, "rule_set_id": rule_set_id, "ruleset_id": None},
        None,
        rule_set_id,
        window,
        outcome="skipped",
        reason="rule_set_not_attached",
        status="unavailable",
        fires=None,
        count=0,
        behaviour=behaviour,
        request_id=request_id,
        trace_id=trace_id,
        span_id=span_id,
        persistence=persistence,
        set_block=set_block,
    )


def _result(
    names: dict[str, Any],
    digest: str | None,
    name: str,
    window: str | None,
    *,
    outcome: str,
    reason: str | None,
    status: str,
    fires: bool | None,
    count: int,
    behaviour: str | None,
    request_id: str | None,
    trace_id: str | None,
    span_id: str | None,
    persistence: str,
    set_block: dict[str, Any] | None,
) -> dict[str, Any]:
    """A rule result object (``mi.probe.result/v1``, ``kind: "rule"``), its keys in the published order."""
    return {
        "schema": SCHEMA,
        "kind": "rule",
        "result_id": str(uuid6.uuid7()),
        "request_id": request_id,
        "trace_id": trace_id,
        "span_id": span_id,
        "probe_id": None,
        "name": name,
        "behaviour": behaviour,
        **names,
        "rule_set_digest": digest,
        "window": window,
        "outcome": outcome,
        "reason": reason,
        "status": status,
        "persistence": persistence,
        "fires": fires,
        "count": count,
        "recorded_at": now_iso(),
        "set": set_block,
    }


def undecided_result(
    loaded: Loaded, name: str, window: str | None, undecided: Undecided, **rest: Any
) -> dict[str, Any]:
    """A result operator code did not decide: skipped while the runner has no answer, else failed."""
    outcome = "skipped" if undecided.skipped else "failed"
    return rule_result(
        loaded, name, window, None, reason=undecided.reason, result_outcome=outcome, status="unavailable", **rest
    )
