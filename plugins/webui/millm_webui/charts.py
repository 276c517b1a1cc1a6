"""Charts as inline SVG numbers (drawn by ``templates/charts.html``; no script, no asset from outside
the server): verdicts over time, a session's grid as a coloured timeline, and a model's measured
budgets against their use. The score histogram is ``histogram.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .verdicts import decided, verdict_word

WIDTH = 480


def verdict_class(result: dict[str, Any]) -> str:
    d = decided(result)
    return "fired" if d is True else "quiet" if d is False else "error"


def _time(iso: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(iso).replace("Z", "+00:00")).timestamp()
    except (TypeError, ValueError):
        return None


class RowChart:
    """The layout every chart here shares: a labelled row per name, drawn across ``width``. Plain class
    attributes, not dataclass fields, so each chart's own (required) fields can still come first."""

    width: int = WIDTH
    row_height: int = 16
    label_width: int = 110
    rows: list[Any]

    @property
    def height(self) -> int:
        return self.row_height * len(self.rows)


@dataclass(frozen=True)
class Dot:
    x: float
    y: float
    kind: str  # fired | quiet | error
    title: str


@dataclass(frozen=True)
class Timeline(RowChart):
    """Verdicts over time: a row per probe (or rule), a dot per result at the time it was recorded."""

    rows: list[str]
    dots: list[Dot]
    start: str
    end: str


def timeline(results: list[dict[str, Any]]) -> Timeline | None:
    """``results`` (any order, each with ``recorded_at`` and a name) → a Timeline, or None when empty."""
    timed = [(t, r) for r in results if (t := _time(r.get("recorded_at"))) is not None]
    if not timed:
        return None
    timed.sort(key=lambda pair: pair[0])
    rows = sorted({str(r.get("name") or r.get("probe_id") or "?") for _, r in timed})
    low, high = timed[0][0], timed[-1][0]
    span = (high - low) or 1.0
    chart = Timeline(
        rows,
        [],
        str(timed[0][1]["recorded_at"])[:19].replace("T", " "),
        str(timed[-1][1]["recorded_at"])[:19].replace("T", " "),
    )
    plot = chart.width - chart.label_width - 8
    for t, r in timed:
        name = str(r.get("name") or r.get("probe_id") or "?")
        x = chart.label_width + 4 + (t - low) / span * plot
        y = rows.index(name) * chart.row_height + chart.row_height / 2
        title = f"{name} {r.get('window', '')} {str(r.get('recorded_at'))[:19]}: {verdict_word(r)}"
        chart.dots.append(Dot(round(x, 1), y, verdict_class(r), title))
    return chart


@dataclass(frozen=True)
class Cell:
    x: float
    y: float
    width: float
    verdict: str
    title: str


@dataclass(frozen=True)
class Strip(RowChart):
    """A session's grid as a coloured timeline: a row per column (behaviour, probe or rule), a cell per turn."""

    rows: list[str]
    cells: list[Cell]
    turns: int


def session_strip(session: dict[str, Any], cell_verdict: Any) -> Strip | None:
    columns = [c["key"] for c in session.get("columns", [])]
    timeline_rows = session.get("timeline", [])
    if not columns or not timeline_rows:
        return None
    strip = Strip(columns, [], len(timeline_rows))
    step = (strip.width - strip.label_width - 4) / len(timeline_rows)
    for i, row in enumerate(timeline_rows):
        for j, key in enumerate(columns):
            v = str(cell_verdict(row.get("cells", {}).get(key, [])))
            strip.cells.append(
                Cell(
                    round(strip.label_width + 2 + i * step, 1),
                    j * strip.row_height + 2,
                    round(max(step - 1, 1), 1),
                    v,
                    f"turn {row.get('turn')} · {key}: {v}",
                )
            )
    return strip


@dataclass(frozen=True)
class BudgetRow:
    label: str
    cost: float
    budget: float
    cost_width: float
    budget_x: float
    over: bool


@dataclass(frozen=True)
class Budgets(RowChart):
    rows: list[BudgetRow] = field(default_factory=list)
    row_height = 22
    label_width = 170


def budgets(armed: dict[str, Any], halves: tuple[tuple[str, str], ...]) -> Budgets | None:
    """The armed set's cost per half against the measured (or fallback) budget line, on one scale."""
    pairs = []
    for half, words in halves:
        h = armed.get(half) or {}
        budget = h.get("fillable_ms") or h.get("budget_ms") or 0.0
        pairs.append((words, float(h.get("cost_ms") or 0.0), float(budget)))
    if not pairs:
        return None
    chart = Budgets()
    plot = chart.width - chart.label_width - 50
    for words, cost, budget in pairs:
        top = max(cost, budget) * 1.15 or 1.0
        chart.rows.append(
            BudgetRow(
                words,
                cost,
                budget,
                round(cost / top * plot, 1),
                round(chart.label_width + budget / top * plot, 1),
                cost > budget > 0,
            )
        )
    return chart
