"""Turning gathered residuals into readings: the one path live and offline scoring share."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..results import ProbeView, Reading, not_scored, ordered, read_window
from .bank import Bank, ProbeUnusable, compile_probe
from .capture import Capture
from .windows import Layout

CONTEXT_TOKENS = 16  # tokens either side of the top position in an event's detail
_EMPTY = np.zeros(0)


@dataclass(frozen=True)
class Plan:
    """What a set of probes reads: each (probe, window) in listing order, and the boundaries they need."""

    pairs: tuple[tuple[ProbeView, str], ...] = ()
    skip_prefix: bool = False  # some probe leaves the template prefix out
    last_user: bool = False  # some probe reads the newest user message
    reasoning: bool = False  # some probe reads the thinking block or the answer after it

    @classmethod
    def of(cls, pairs: Iterable[tuple[ProbeView, str]]) -> Plan:
        listed = tuple(ordered(list(pairs)))
        return cls(
            listed,
            any(v.definition.aggregation.skip_template_prefix for v, _ in listed),
            any(window == "last_user" for _, window in listed),
            any(window in ("reasoning", "answer") for _, window in listed),
        )


def compile_bank(
    views: Sequence[ProbeView], engine: Any, sae_dir: str | None, encoders: dict[str, Any]
) -> tuple[Bank | None, dict[str, ProbeUnusable]]:
    """The views' heads compiled for ``engine`` as one bank (None when none compiles), and why the rest
    cannot run there (engine thread)."""
    usable, unusable = [], {}
    for view in views:
        try:
            usable.append(compile_probe(view.probe_id, view.definition, engine, sae_dir, encoders))
        except ProbeUnusable as exc:
            unusable[view.probe_id] = exc
    return (Bank(usable) if usable else None), unusable


def read_pairs(
    pairs: Sequence[tuple[ProbeView, str]],
    bank: Bank | None,
    columns: np.ndarray | None,
    layout: Layout,
    unusable: dict[str, ProbeUnusable] | None = None,
    interrupted: str | None = None,
) -> list[Reading]:
    """A reading for each (probe, window) from the request's per-position columns."""
    unread = bank is None or columns is None
    if unread:  # no position was read: every window is empty
        layout = replace(layout, positions=0)
    readings = []
    for view, window in pairs:
        problem = (unusable or {}).get(view.probe_id)
        if problem is not None:
            readings.append(not_scored("failed", problem.reason, interrupted))
            continue
        if bank is None or columns is None:  # unread
            per_token, logits = _EMPTY, None
        else:
            per_token, logits = bank.per_token(columns, view.probe_id), bank.logits(columns, view.probe_id)
        readings.append(read_window(view, window, layout, per_token, logits, interrupted))
    return readings


def forward_columns(engine: Any, bank: Bank, ids: Sequence[int]) -> np.ndarray:
    """One unsteered forward pass over ``ids`` with only the probes' read hooks (engine thread)."""
    capture = Capture(bank.points, len(ids))
    engine.forward(list(ids), hooks=capture.hooks())
    return bank.columns(capture.rows())


def detail(engine: Any, ids: Sequence[int], reading: Reading) -> dict[str, Any] | None:
    """The decoded text around a reading's top position (stored; served by the event detail route only)."""
    top = reading.top_position
    if top is None or top >= len(ids):
        return None
    start, end = max(0, top - CONTEXT_TOKENS), min(len(ids), top + CONTEXT_TOKENS + 1)
    return {
        "top_position": top,
        "top_token": engine.token_bytes(ids[top]).decode("utf-8", "replace"),  # special tokens shown too
        "context_start": start,
        "context_end": end,
        "context_text": engine.decode(list(ids[start:end])),
    }
