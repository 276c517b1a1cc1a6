"""Turning gathered residuals into readings: the one path live and offline scoring share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .capture import Capture
from .results import ProbeView, Reading, not_scored, read_window
from .scoring import Bank, ProbeUnusable
from .windows import Layout

CONTEXT_TOKENS = 16  # tokens either side of the top position in an event's detail
_EMPTY = np.zeros(0)


def read_pairs(
    pairs: Sequence[tuple[ProbeView, str]],
    bank: Bank | None,
    columns: np.ndarray | None,
    layout: Layout,
    unusable: dict[str, ProbeUnusable] | None = None,
    interrupted: str | None = None,
) -> list[Reading]:
    """A reading for each (probe, window) from the request's per-position columns."""
    readings = []
    for view, window in pairs:
        problem = (unusable or {}).get(view.probe_id)
        if problem is not None:
            readings.append(not_scored("failed", problem.reason, interrupted))
            continue
        if bank is None or columns is None:
            per_token, logits = _EMPTY, None
            layout = Layout(positions=0, prompt_len=layout.prompt_len, boundary_failure=layout.boundary_failure,
                            prefix=layout.prefix, last_user=layout.last_user, last_user_reason=layout.last_user_reason)
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
