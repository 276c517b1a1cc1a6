"""``mi.probe.result/v1``: the one result object every surface carries.

Built once per probe and window when a request (or a stateless input) finishes;
the header, the body field, the stream chunk, the stored event, the events list
and stateless scoring all show this same object (the header a subset of it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import uuid6

from .definition import WINDOWS, Decision, ProbeDefinition
from .digests import ALGORITHM
from .scoring.bank import aggregate
from .scoring.windows import Layout, NotScored, window_span

SCHEMA = "mi.probe.result/v1"


@dataclass(frozen=True)
class ProbeView:
    """What a result needs to know about its probe, fixed when the request starts."""

    probe_id: str
    name: str
    behaviour: str | None
    version: str | None
    definition: ProbeDefinition
    decision: Decision | None  # the current bar (moved by recalibration)
    decision_digest: str
    decision_revision: int
    threshold_revision: int
    detector_digest: str
    detector_digest_source: str

    @property
    def windows(self) -> list[str]:
        """The windows the bar is read on (the probe's scope when the decision names none)."""
        if self.decision is not None and self.decision.windows:
            return list(self.decision.windows)
        return [self.definition.scope]

    @property
    def group(self) -> tuple[str, bool]:
        """Where a probe's results are listed: under its behaviour (a probe naming none is its own)."""
        return (self.behaviour if self.behaviour is not None else self.name, self.behaviour is None)


@dataclass(frozen=True)
class Served:
    """How the request was actually served."""

    engine: str | None
    execution_mode: str  # serial, continuous, batched, stateless
    batch_size: int | None  # the most sequences a forward pass held beside it (itself included)
    precision: str | None
    served_model: str | None
    model_revision: str | None
    model_load_id: str | None
    template_sha256: str | None

    @classmethod
    def of(cls, engine: Any, execution_mode: str, batch_size: int | None = None) -> Served:
        info = engine.info if engine is not None else None
        return cls(
            engine=getattr(engine, "name", None) or None,
            execution_mode=execution_mode,
            batch_size=batch_size,
            precision=info.dtype if info else None,
            served_model=info.id if info else None,
            model_revision=info.revision if info else None,
            model_load_id=info.load_id if info else None,
            template_sha256=info.chat_template_sha256 if info else None,
        )


@dataclass(frozen=True)
class Trace:
    trace_id: str
    span_id: str


@dataclass
class Reading:
    """A probe's reading on one window before it becomes a result object."""

    outcome: str
    reason: str | None
    status: str = "final"
    score: float | None = None
    n_scored_tokens: int = 0
    threshold: float | None = None
    verdict: bool | None = None
    top_position: int | None = None
    #: The window's per-token scores (``per_token[start:end]``) and the absolute position of the first.
    token_scores: np.ndarray | None = None
    first_position: int = 0


def threshold_for(decision: Decision | None, length: int) -> float | None:
    """The bar for a window of ``length`` positions: the first length band that fits, else the threshold."""
    if decision is None:
        return None
    for band in decision.length_bands or ():
        if band.max_tokens >= length:
            return band.threshold
    return decision.threshold


def not_scored(outcome: str, reason: str, interrupted: str | None) -> Reading:
    if interrupted:
        return Reading("interrupted", interrupted, "unavailable")
    return Reading(outcome, reason)


def read_window(
    view: ProbeView,
    window: str,
    layout: Layout,
    per_token: np.ndarray,
    logits: np.ndarray | None,
    interrupted: str | None = None,
) -> Reading:
    """Score one window: verdict ``score >= threshold``; an interrupted request never gets a verdict."""
    d = view.definition
    span = window_span(layout, window, d.aggregation.skip_template_prefix)
    if isinstance(span, NotScored):
        return not_scored(span.outcome, span.reason, interrupted)
    scores = per_token[span.start : span.end]
    window_logits = logits[span.start : span.end] if logits is not None else None
    with np.errstate(all="ignore"):
        score = aggregate(d.aggregation.rule, d.aggregation.params.get("k"), scores, window_logits)
    if not math.isfinite(score):
        return not_scored("failed", "non_finite_score", interrupted)
    threshold = threshold_for(view.decision, span.length)
    top = span.start + int(np.nanargmax(scores)) if np.isfinite(scores).any() else None
    if interrupted:
        return Reading(
            "interrupted", interrupted, "partial", score, span.length, threshold, None, top, scores, span.start
        )
    verdict = None if threshold is None else bool(score >= threshold)
    return Reading("completed", None, "final", score, span.length, threshold, verdict, top, scores, span.start)


def token_scores_object(reading: Reading) -> dict[str, Any] | None:
    """``token_scores``: ``{positions, scores}``, one score per position the window covers (absolute: prompt
    then generated tokens; a score that is not finite is null); None when the window was not scored."""
    scores = reading.token_scores
    if scores is None:
        return None
    start = reading.first_position
    return {
        "positions": list(range(start, start + len(scores))),
        "scores": [float(v) if math.isfinite(v) else None for v in scores.tolist()],
    }


def new_result_id() -> str:
    """A time-ordered UUID (v7): results sort by when they were made."""
    return str(uuid6.uuid7())


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def result_object(
    view: ProbeView,
    window: str,
    reading: Reading,
    served: Served,
    trace: Trace,
    request_id: str | None,
    persistence: str,
    set_block: dict[str, Any] | None = None,
    token_scores: bool = False,
) -> dict[str, Any]:
    """The ``mi.probe.result/v1`` object (``verdict`` absent when no verdict was reached; ``set`` null for a
    probe naming no behaviour; ``token_scores`` when asked, null for a window not scored)."""
    d = view.definition
    obj: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": "probe",
        "result_id": new_result_id(),
        "request_id": request_id,
        "trace_id": trace.trace_id,
        "span_id": trace.span_id,
        "probe_id": view.probe_id,
        "name": view.name,
        "behaviour": view.behaviour,
        "version": view.version,
        "window": window,
        "outcome": reading.outcome,
        "reason": reading.reason,
        "status": reading.status,
        "persistence": persistence,
        "scored": reading.score is not None,
        "score": reading.score,
        "threshold": reading.threshold,
        "fires": reading.verdict,
        "n_scored_tokens": reading.n_scored_tokens,
        "rung": d.evidence.rung,
        "rung_language": d.rung_language,
        "provisional": d.evidence.provisional,
        "detector_digest": view.detector_digest,
        "detector_digest_source": view.detector_digest_source,
        "identity_algorithm": ALGORITHM,
        "decision_digest": view.decision_digest,
        "decision_revision": view.decision_revision,
        "threshold_revision": view.threshold_revision,
        "engine": served.engine,
        "execution_mode": served.execution_mode,
        "batch_size": served.batch_size,
        "precision": served.precision,
        "served_model": served.served_model,
        "model_revision": served.model_revision,
        "model_load_id": served.model_load_id,
        "template_sha256": served.template_sha256,
        "recorded_at": now_iso(),
        "set": set_block,
    }
    if reading.verdict is not None:
        obj["verdict"] = reading.verdict
    if token_scores:
        obj["token_scores"] = token_scores_object(reading)
    return obj


WINDOW_ORDER = {window: i for i, window in enumerate(WINDOWS)}


def ordered(pairs: list[tuple[ProbeView, str]]) -> list[tuple[ProbeView, str]]:
    """Behaviour by behaviour, then by name and window, so one behaviour's results sit together."""
    return sorted(pairs, key=lambda p: (p[0].group, p[0].name, p[0].probe_id, WINDOW_ORDER[p[1]]))


def behaviour_sets(pairs: Sequence[tuple[ProbeView, str]], blocks: dict[str, Any]) -> dict[str, Any]:
    """Each behaviour -> the ``set`` block its probes' results carry, for the results other plugins list beside
    them (hook ``monitor_results``): a rule result says what its behaviour's probe results say of the set."""
    found: dict[str, Any] = {}
    for view, _ in pairs:
        if view.behaviour is not None and view.behaviour not in found:
            found[view.behaviour] = blocks.get(view.probe_id)
    return found


def _group_of(result: dict[str, Any]) -> tuple[str, bool]:
    """``ProbeView.group`` of a result object: its behaviour, or its own name when it names none."""
    behaviour = result.get("behaviour")
    return (behaviour, False) if behaviour is not None else (str(result.get("name")), True)


def listing(results: list[dict[str, Any]]) -> list[int]:
    """The indices of ``results`` (the probes' in ``ordered`` order, then other plugins') in the one listing order:
    behaviour by behaviour, each behaviour's probe results, then the results other plugins added for it (rule
    signals). Header truncation leaves out whole behaviours, so a behaviour's rules go with its probes."""
    return sorted(range(len(results)), key=lambda i: (_group_of(results[i]), results[i].get("kind") != "probe"))


def merged(results: list[dict[str, Any]], others: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``results`` and ``others`` in the one listing order (see ``listing``)."""
    every = results + others
    return [every[i] for i in listing(every)]
