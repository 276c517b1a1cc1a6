"""The costing function's structure (probe-monitors.txt, "Probe limits per model"), not its timings.

``costs.cost`` prices a set as: per hooked point ``layer``; per probe its kind's unit; once,
``request``; per result ``result``; on each half alike, and nothing at all while nothing is armed.
``measure._units`` says what each unit is made of. Unit values here are powers of two, so every
term of a sum can be read back from it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from millm_probes.capacity import costs, measure

UNITS = {
    "per_token": {
        "layer": 1.0,
        "mean": 2.0,
        "max": 4.0,
        "attention": 8.0,
        "sparse": 16.0,
        "request": 0.0,
        "result": 0.0,
    },
    "per_1k_prompt": {
        "layer": 32.0,
        "mean": 64.0,
        "max": 128.0,
        "attention": 256.0,
        "sparse": 512.0,
        "request": 1024.0,
        "result": 2048.0,
    },
}


def view(layer: int, rule: str = "mean", *, point: str = "resid_post", basis: str = "residual", windows=("all",)):
    definition = SimpleNamespace(
        basis=basis, aggregation=SimpleNamespace(rule=rule), read=SimpleNamespace(layer=layer, hook_point=point)
    )
    return SimpleNamespace(definition=definition, windows=list(windows))


def test_a_set_costs_its_points_kinds_request_and_results():
    views = [
        view(3, "mean", windows=("all", "prompt")),
        view(3, "max"),  # the same point: hooked once
        view(3, "attention", point="resid_pre"),  # another point of the same layer
        view(5, "last"),  # costed as a mean probe
        view(5, "topk_mean"),
        view(7, "mean", basis="sae"),  # an SAE-basis probe is sparse, whatever its rule
    ]
    shape = costs.Shape.of(views)
    assert shape.points == 4 and shape.results == 7 and shape.probes == 6
    assert dict(shape.kinds) == {"mean": 3, "max": 1, "attention": 1, "sparse": 1}
    spent = costs.cost(UNITS, shape)
    assert spent["per_token"] == 4 * 1 + 3 * 2 + 4 + 8 + 16  # no per-request work on the token half
    assert spent["per_1k_prompt"] == 4 * 32 + 3 * 64 + 128 + 256 + 512 + 1024 + 7 * 2048


def test_nothing_armed_costs_nothing_and_plus_is_of():
    assert costs.cost(UNITS, costs.Shape.of([])) == {"per_token": 0.0, "per_1k_prompt": 0.0}
    armed, more = [view(1), view(2, "max")], [view(2, "attention"), view(9)]
    assert costs.Shape.of(armed).plus(more) == costs.Shape.of(armed + more)
    budget = {"basis": "measured", "units": UNITS}
    for half in costs.HALVES:
        budget[half] = {"fillable_ms": 1e9, "budget_ms": 1e9, "source": "measured"}
    assert costs.project(budget, armed + more) == costs.project(budget, costs.Shape.of(armed + more))


def test_the_recommendations_shapes():
    dense = costs.Shape.dense(5)
    assert (dense.points, dict(dense.kinds), dense.results) == (1, {"mean": 5}, 5)
    sets = costs.Shape.reference_sets(2)  # nine probes over three layers, mixed rules, each
    assert (sets.points, dict(sets.kinds), sets.results) == (6, {"mean": 6, "max": 6, "attention": 6}, 18)
    assert costs.Shape.dense(0).points == 0


def test_what_each_measured_unit_is_made_of(monkeypatch):
    """The hook units are the callback plus the rest of the path plus the point's scoring; a request's
    own work is split into once and per result from the two private sets, leaving out their scoring's
    arithmetic and the point's part, and a result carries its rendering into the body."""
    per_1k = {"mean": 0.5, "max": 0.25, "attention": 1.0}
    monkeypatch.setattr(measure, "_scoring", lambda engine, sync, clock: (per_1k, 4.0))
    hook = {"callback": 0.03, "dispatch": 0.01, "prompt_callback": 0.6}
    work = {
        1: {"request": 10.0, "render": 0.5, "request_ms": 10.0, "request_cpu_ms": 9.0, "results": 1, "positions": 40},
        101: {
            "request": 60.0,
            "render": 10.5,
            "request_ms": 61.0,
            "request_cpu_ms": 59.0,
            "results": 101,
            "positions": 40,
        },
    }
    units, parts = measure._units(None, lambda: None, hook, work, lambda: 0.0)
    token, prompt = units["per_token"], units["per_1k_prompt"]
    assert token["layer"] == pytest.approx(0.03 + 0.01 + 4.0 / 1000)
    assert prompt["layer"] == pytest.approx(0.6 + 0.01 + 4.0)
    assert token["mean"] == pytest.approx(0.5 / 1000) and prompt["attention"] == pytest.approx(1.0)
    assert prompt["sparse"] == pytest.approx(measure.SPARSE_FACTOR * 0.5)
    arithmetic = 0.5 * 40 / 1000  # a probe's scoring over these requests' positions
    slope = (60.0 - 10.0) / 100 - arithmetic
    assert prompt["result"] == pytest.approx(slope + (10.5 - 0.5) / 100, abs=1e-6)
    assert prompt["request"] == pytest.approx(10.0 - (slope + arithmetic) - 4.0, abs=1e-6)
    assert token["request"] == 0.0 and token["result"] == 0.0  # charged to the prompt half
    assert parts["render_ms_per_result"] == pytest.approx(0.1) and parts["request_many_results"] == 101
