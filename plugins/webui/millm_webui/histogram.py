"""A score histogram against the threshold, as an inline SVG's numbers (drawn by the template)."""

from __future__ import annotations

from dataclasses import dataclass

WIDTH, HEIGHT, BINS = 240, 60, 12


@dataclass(frozen=True)
class Histogram:
    bars: list[tuple[float, float, float, int]]  # x, width, height, count
    threshold_x: float | None  # None: the threshold lies off the chart
    threshold_side: str  # "", "left" or "right" of the scores
    low: float
    high: float
    width: int = WIDTH
    height: int = HEIGHT


def histogram(scores: list[float], threshold: float | None) -> Histogram | None:
    if not scores:
        return None
    low, high = min(scores), max(scores)
    if threshold is not None and abs(threshold - (low + high) / 2) <= 4 * max(high - low, 1.0):
        low, high = min(low, threshold), max(high, threshold)  # a nearby threshold is drawn on the chart
    span = (high - low) or 1.0
    counts = [0] * BINS
    for score in scores:
        counts[min(int((score - low) / span * BINS), BINS - 1)] += 1
    top = max(counts)
    step = WIDTH / BINS
    bars = [(i * step, step - 1, HEIGHT * c / top, c) for i, c in enumerate(counts)]
    side, x = "", None
    if threshold is not None:
        if threshold < low:
            side = "left"
        elif threshold > high:
            side = "right"
        else:
            x = (threshold - low) / span * WIDTH
    return Histogram(bars, x, side, low, high)
