"""The per-model cost budget (probe-monitors.txt, "Probe limits per model", decision D83).

Probes may slow each token by at most ``PROBE_SLOWDOWN_BUDGET_PCT`` of the
model's own time, and arming fills at most ``PROBE_BUDGET_HEADROOM`` of that.
The budget has two halves: per generated token and per 1,000 prompt tokens.
Where generations share a continuous batch, a measurement adds a per-token half
for each batch size it timed (``per_token_rows_N``): a row there pays its share
of the model's step (the base of its budget) and of each batched read, so the
same set is a larger share of a row's time the fuller the batch; a set must fit
every half.
Until a model is measured (or when its measurement is stale) the fallback
budgets ``PROBE_MAX_OVERHEAD_MS_PER_PASS`` and ``PROBE_MAX_PREFILL_MS_PER_1K``
apply, with the reference unit costs below.

A set of probes costs, on each half, a fixed part per hooked residual point
plus each probe's own arithmetic by kind, and on the prompt half the work done
once per request (``cost`` over a ``Shape``): the one function the arming gate,
the dry run and the recommendation all use. A budget approved before D83's
date is not in force (``not_in_force``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

HALVES = ("per_token", "per_1k_prompt")
ROWS_HALF = "per_token_rows_"  # + N: per generated token of a row in a continuous batch of N rows
KINDS = ("layer", "mean", "max", "attention", "sparse", "request", "result")
SPARSE_FACTOR = 5.0  # "a k-sparse probe costs about five times a dense one per token" (no SAE to time it with)

#: Unit costs (ms) used until the model is measured: the shape of the 2026-10-21 RTX 3090 reference
#: (about seven dense probes on one layer fill the fallback budgets). That reference timed no per-request
#: work, so its ``request`` and ``result`` are 0: only a measurement prices them.
REFERENCE_UNITS: dict[str, dict[str, float]] = {
    "per_token": {"layer": 0.015, "mean": 0.03, "max": 0.03, "attention": 0.045, "sparse": 0.15},
    "per_1k_prompt": {"layer": 0.03, "mean": 0.06, "max": 0.06, "attention": 0.09, "sparse": 0.3},
}

#: A reference set: nine probes over three layers, mixed rules.
REFERENCE_SET = tuple((layer, rule) for layer in range(3) for rule in ("mean", "max", "attention"))

FIT_CAP = 100_000  # a count past this is reported as this (a unit measured at ~0 would fit without end)


def kind_of(view: Any) -> str:
    """The cost kind of a probe: its rule's, or sparse for an SAE-basis probe."""
    d = view.definition
    if d.basis == "sae":
        return "sparse"
    rule = d.aggregation.rule
    return rule if rule in ("max", "attention") else "mean"


@dataclass(frozen=True)
class Shape:
    """What an armed set costs by: its hooked points, how many probes of each kind, and results per request.

    Counts, not lists: a set of thousands is costed in constant time, so the gate can cost each probe of a
    large behaviour beside the armed set (``plus``) without going quadratic."""

    points: int  # hooked residual points
    kinds: tuple[tuple[str, int], ...]  # (kind, how many), in KINDS order, kinds with none left out
    results: int
    hooked: frozenset[tuple[int, str]] = frozenset()  # which points (a set's; the synthetic shapes name none)

    @classmethod
    def of(cls, views: Iterable[Any]) -> Shape:
        return cls(0, (), 0).plus(views)

    def plus(self, views: Iterable[Any]) -> Shape:
        """This set's shape with ``views`` armed beside it."""
        hooked, counts, results = set(self.hooked), dict(self.kinds), self.results
        for view in views:
            hooked.add((view.definition.read.layer, view.definition.read.hook_point))
            kind = kind_of(view)
            counts[kind] = counts.get(kind, 0) + 1
            results += len(view.windows)
        return Shape(len(hooked), _counted(counts), results, frozenset(hooked))

    @property
    def probes(self) -> int:
        return sum(count for _, count in self.kinds)

    @classmethod
    def dense(cls, count: int) -> Shape:
        """``count`` dense (mean) probes on one layer, one window each."""
        return cls(1 if count else 0, _counted({"mean": count}), count)

    @classmethod
    def reference_sets(cls, count: int) -> Shape:
        """``count`` reference sets, each on three layers of its own."""
        per_set: dict[str, int] = {}
        for _, rule in REFERENCE_SET:
            per_set[rule] = per_set.get(rule, 0) + count
        return cls(3 * count, _counted(per_set), len(REFERENCE_SET) * count)


def _counted(counts: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple((kind, counts[kind]) for kind in KINDS if counts.get(kind))


def cost(units: dict[str, dict[str, float]], shape: Shape) -> dict[str, float]:
    """Milliseconds a set of ``shape`` adds on each half: THE costing, for the gate, the dry run and the
    recommendation alike.

    Per hooked point, the read hook as a forward pass really pays it (torch's hook dispatch, the callback,
    the copy); per probe, its arithmetic by kind; and, once armed at all, the per-request work (what a
    monitored request does once: its session, capture, scoring set-up, results' transaction and header:
    ``request``; and per result: read, built, stored and rendered: ``result``). A request has one prompt and
    the prompt half is the budget of a 1,000-token prompt, so per-request work is charged there; the
    generated-token half carries what every pass pays.
    """
    if not shape.kinds:
        return {half: 0.0 for half in units}
    out = {}
    for half, u in units.items():
        out[half] = (
            shape.points * u["layer"]
            + sum(u[kind] * count for kind, count in shape.kinds)
            + u.get("request", 0.0)
            + shape.results * u.get("result", 0.0)
        )
    return out


def set_cost(units: dict[str, dict[str, float]], views: Iterable[Any]) -> dict[str, float]:
    """What a set of probes costs, costed as measure costs it."""
    return cost(units, Shape.of(views))


# --- the budget ----------------------------------------------------------------------------


def identity_of(info: Any) -> dict[str, Any]:
    """What a measurement was taken on: a change to any of these makes it stale."""
    return {
        "hf_id": info.hf_id,
        "revision": info.revision,
        "d_model": info.d_model,
        "n_layers": info.n_layers,
        "precision": info.dtype,
        "device": info.device,
    }


def stale_fields(measurement: dict[str, Any] | None, info: Any | None) -> list[str] | None:
    """Which of model, precision or device changed since ``measurement`` (None: cannot tell)."""
    if measurement is None or info is None:
        return None
    now = identity_of(info)
    return [key for key, value in now.items() if measurement["identity"].get(key) != value]


#: Decision D83: from this instant the budget is a share of the model's own time. A budget approved before it
#: was sized from the old count of behaviours and is no longer in force.
D83_IN_FORCE_FROM = datetime(2026, 10, 29, tzinfo=UTC)


def parse_instant(value: Any) -> datetime | None:
    """An ISO 8601 instant, tz-aware (a naive one is read as UTC); None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        return None
    return instant if instant.tzinfo is not None else instant.replace(tzinfo=UTC)


def not_in_force(limits: dict[str, Any] | None) -> str | None:
    """Why stored limits are not in force (None when they are, or there are none)."""
    if limits is None or limits.get("mode") != "approved":
        return None
    approved_at = parse_instant(limits.get("set_at"))
    if approved_at is None:
        return (
            "approved at an unknown time, so possibly before 2026-10-29 (decision D83), when budgets were sized "
            "from the count of behaviours; the PROBE_SLOWDOWN_BUDGET_PCT budget (5% by default) applies until "
            "the new recommendation is approved"
        )
    if approved_at < D83_IN_FORCE_FROM:
        return (
            f"approved {approved_at.isoformat()}, before 2026-10-29 (decision D83): it was sized from the old "
            "count of behaviours, so the PROBE_SLOWDOWN_BUDGET_PCT budget (5% by default) applies until the new "
            "recommendation is approved"
        )
    return None


def units_of(measurement: dict[str, Any] | None) -> dict[str, dict[str, float]]:
    return measurement["units"] if measurement is not None else REFERENCE_UNITS


def budget(
    settings: Any, measurement: dict[str, Any] | None, limits: dict[str, Any] | None, info: Any | None
) -> dict[str, Any]:
    """Both halves of the budget in force, and where each came from.

    ``measurement`` counts only when it is not stale; ``limits`` is what PUT probe-limits stored, and counts
    only while in force (``not_in_force``).
    """
    if not_in_force(limits):
        limits = None
    stale = stale_fields(measurement, info)
    usable = measurement if measurement is not None and not stale else None
    headroom = settings["PROBE_BUDGET_HEADROOM"]
    pct, pct_source = settings["PROBE_SLOWDOWN_BUDGET_PCT"], "setting PROBE_SLOWDOWN_BUDGET_PCT"
    if limits is not None and limits.get("pct") is not None:
        pct, pct_source = limits["pct"], limits["mode"]
    fallback = {
        "per_token": settings["PROBE_MAX_OVERHEAD_MS_PER_PASS"],
        "per_1k_prompt": settings["PROBE_MAX_PREFILL_MS_PER_1K"],
    }
    fallback_names = {"per_token": "PROBE_MAX_OVERHEAD_MS_PER_PASS", "per_1k_prompt": "PROBE_MAX_PREFILL_MS_PER_1K"}
    halves: dict[str, Any] = {}
    units = units_of(usable)
    for half in units:
        # An override of the per-token half is a row's ms per token, in a batch or alone.
        ms = (limits or {}).get(f"ms_{half}" if not half.startswith(ROWS_HALF) else "ms_per_token")
        if ms is not None:
            budget_ms, source = ms, "override"
        elif usable is not None:
            budget_ms, source = pct / 100.0 * usable["step"][f"ms_{half}"], "measured"
        else:
            budget_ms, source = fallback[half], "fallback"
        halves[half] = {
            "budget_ms": budget_ms,
            "fillable_ms": budget_ms * headroom,
            "source": source,
            "setting": fallback_names[half] if source == "fallback" else None,
            # the model's own ms on this half (a row's share of the batch's step): what overhead is a share of
            "step_ms": usable["step"][f"ms_{half}"] if usable is not None else None,
        }
        if half.startswith(ROWS_HALF):
            halves[half]["batch_rows"] = int(half.removeprefix(ROWS_HALF))
    measured = usable is not None
    return {
        "measured": measured,
        "basis": "measured" if measured else ("fallback (the measurement is stale)" if stale else "fallback"),
        "slowdown_budget_pct": pct,
        "slowdown_budget_pct_source": pct_source,
        "headroom": headroom,
        "units": units,
        "units_source": "measured" if measured else "reference",
        "halves": list(units),
        **halves,
    }


def project(budget_now: dict[str, Any], views: Iterable[Any] | Shape) -> dict[str, Any]:
    """A set's projected cost (its views, or their ``Shape``) against both halves of ``budget_now``."""
    spent = cost(budget_now["units"], views if isinstance(views, Shape) else Shape.of(views))
    halves = {
        half: {
            "cost_ms": round(spent[half], 6),
            "fillable_ms": round(budget_now[half]["fillable_ms"], 6),
            "budget_ms": round(budget_now[half]["budget_ms"], 6),
            "source": budget_now[half]["source"],
            "fits": spent[half] <= budget_now[half]["fillable_ms"] + 1e-12,
            "overhead_pct": _pct(spent[half], budget_now[half].get("step_ms")),
        }
        for half in budget_now["units"]
    }
    return {"basis": budget_now["basis"], "fits": all(h["fits"] for h in halves.values()), **halves}


def _pct(spent: float, step_ms: float | None) -> float | None:
    """``spent`` as a percentage of the model's own ``step_ms`` (None when not measured)."""
    return round(100.0 * spent / step_ms, 4) if step_ms else None


def half_at_rows(halves: Iterable[str], rows: int) -> str:
    """The per-token half that prices a row of a batch of ``rows``: the smallest measured batch size at
    least ``rows`` (the largest measured when the batch is fuller), ``per_token`` for a row alone."""
    sizes = sorted(int(h.removeprefix(ROWS_HALF)) for h in halves if h.startswith(ROWS_HALF))
    if rows <= 1 or not sizes:
        return "per_token"
    return f"{ROWS_HALF}{next((size for size in sizes if size >= rows), sizes[-1])}"


def over_message(projection: dict[str, Any]) -> str:
    """Which halves a projection exceeds, saying whether the budget is measured or fallback."""
    over = [
        f"{half.replace('_', ' ')} {projection[half]['cost_ms']:.4g} ms > {projection[half]['fillable_ms']:.4g} ms "
        f"({projection[half]['source']})"
        for half in HALVES + tuple(h for h in projection if h.startswith(ROWS_HALF))
        if not projection[half]["fits"]
    ]
    return f"the armed set would cost {'; '.join(over)}; the budget is {projection['basis']}"


# --- the recommendation --------------------------------------------------------------------


def fits(units: dict[str, dict[str, float]], fillable: dict[str, float], shape: Shape) -> bool:
    """Whether ``shape`` fits both halves of ``fillable`` (the arming gate's own test)."""
    spent = cost(units, shape)
    return all(spent[h] <= fillable[h] + 1e-12 for h in units)


def most_that_fit(units: dict[str, dict[str, float]], fillable: dict[str, float], shape: Callable[[int], Shape]) -> int:
    """The largest count whose ``shape(count)`` fits (cost grows with the count: a binary search)."""
    low, high = 0, FIT_CAP
    if fits(units, fillable, shape(high)):
        return high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(units, fillable, shape(middle)) else (low, middle)
    return low


def recommendation(settings: Any, measurement: dict[str, Any] | None) -> dict[str, Any] | None:
    """The default share of this measurement, explained (None until measured)."""
    if measurement is None:
        return None
    pct, headroom = settings["PROBE_SLOWDOWN_BUDGET_PCT"], settings["PROBE_BUDGET_HEADROOM"]
    units = measurement["units"]
    budget_ms = {half: pct / 100.0 * measurement["step"][f"ms_{half}"] for half in units}
    fillable = {half: budget_ms[half] * headroom for half in units}
    sets = most_that_fit(units, fillable, Shape.reference_sets)
    dense = most_that_fit(units, fillable, Shape.dense)
    body = {
        "slowdown_budget_pct": pct,
        "headroom": headroom,
        "measurement_id": measurement["measurement_id"],
        "budget_ms": {h: round(v, 6) for h, v in budget_ms.items()},
        "fillable_ms": {h: round(v, 6) for h, v in fillable.items()},
        "reference_sets_fit": sets,
        "dense_probes_fit": dense,
        # what the counts above cost, by the function the arming gate uses (``cost``)
        "dense_cost_ms": {h: round(v, 6) for h, v in cost(units, Shape.dense(dense)).items()},
        "reference_sets_cost_ms": {h: round(v, 6) for h, v in cost(units, Shape.reference_sets(sets)).items()},
    }
    body["explanation"] = (
        f"{pct:g}% of this model's own time is {budget_ms['per_token']:.4g} ms per generated token and "
        f"{budget_ms['per_1k_prompt']:.4g} ms per 1,000 prompt tokens; arming fills {headroom:g} of it. "
        f"That fits {sets} reference set(s) (nine probes over three layers, mixed rules) or {dense} dense "
        f"probes on one layer, costed exactly as arming costs them (per hooked layer, per probe, and per "
        f"request on the prompt half)."
    )
    rows = [half for half in units if half.startswith(ROWS_HALF)]
    if rows:
        body["explanation"] += " In a continuous batch a row pays its share of the batch's step, so the counts fit " + (
            ", ".join(f"{budget_ms[h]:.4g} ms per token at {h.removeprefix(ROWS_HALF)} rows" for h in rows) + " too."
        )
    body["digest"] = digest(body)
    return body


def digest(obj: Any) -> str:
    data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return "sha256:" + hashlib.sha256(data).hexdigest()
