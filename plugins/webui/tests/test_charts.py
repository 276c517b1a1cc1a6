"""Charts drawn as inline SVG from the API's answers (no server, no browser): verdicts over time, a
session's grid as a timeline, budgets against use; and the Playground's empty states."""

from __future__ import annotations

from millm_webui import charts
from millm_webui.pages import models, playground, sessions
from millm_webui.render import render

from .test_pages import HOSTILE, FakeApi, show


def result(name: str, at: str, verdict, **extra) -> dict:
    return {"name": name, "kind": "probe", "verdict": verdict, "window": "all", "recorded_at": at, **extra}


def test_verdicts_over_time_place_each_result_on_its_probes_row_in_time_order():
    t = charts.timeline(
        [
            result("b", "2026-12-01T00:00:10Z", True),
            result("a", "2026-12-01T00:00:00Z", False),
            {"name": "rule", "kind": "rule", "fires": None, "recorded_at": "2026-12-01T00:00:20Z"},
        ]
    )
    assert t.rows == ["a", "b", "rule"]
    assert [d.kind for d in t.dots] == ["quiet", "fired", "error"]
    xs = [d.x for d in t.dots]
    assert xs == sorted(xs) and xs[0] == t.label_width + 4 and xs[-1] == t.width - 4
    assert charts.timeline([]) is None


def test_the_session_strip_colours_a_cell_per_turn_and_column():
    session = {
        "columns": [{"key": "x"}, {"key": HOSTILE}],
        "timeline": [{"turn": 1, "cells": {"x": [result("x", "", True)]}}, {"turn": 2, "cells": {}}],
    }
    strip = charts.session_strip(session, sessions.cell_verdict)
    assert [c.verdict for c in strip.cells] == ["fired", "none", "none", "none"]
    html = render("charts.html")  # the macros alone render nothing
    assert html.strip() == ""


def test_budgets_put_use_and_the_budget_line_on_one_scale():
    armed = {"per_token": {"cost_ms": 2.0, "fillable_ms": 1.0}, "per_1k_prompt": {"cost_ms": 1.0, "fillable_ms": 4.0}}
    b = charts.budgets(armed, models.HALVES)
    over, under = b.rows
    assert over.over and not under.over
    assert over.cost_width > over.budget_x - b.label_width  # the bar runs past its line
    assert under.cost_width < under.budget_x - b.label_width


def test_the_playground_without_an_sae_says_how_to_register_one():
    api = FakeApi({"/api/health": {"status": "ok", "model": "m"}, "/api/saes": {"data": []}})
    html = show(playground.PAGE, api)
    assert "Register an SAELens directory and attach it" in html and 'href="/ui/steering#saes"' in html
    assert '<option value="features" disabled>' in html


def test_the_playground_names_the_attached_saes_and_escapes_them():
    sae = {"sae_id": HOSTILE, "d_sae": 96, "attached": [{"layer": 1}]}
    api = FakeApi(
        {
            "/api/health": {"status": "ok", "model": "m"},
            "/api/saes": {"data": [sae]},
            "/api/profiles": {"data": [{"name": HOSTILE}]},
        }
    )
    html = show(playground.PAGE, api)
    assert HOSTILE not in html and "&lt;script&gt;" in html
    assert "(layer 1, 96 features)" in html


def test_the_session_page_and_the_models_page_draw_their_charts():
    session = {
        "turns": 2,
        "fired": 1,
        "source": "header",
        "columns": [{"key": "b", "kind": "behaviour"}],
        "timeline": [
            {
                "turn": 1,
                "cells": {"b": [result("p", "2026-12-01T00:00:00Z", True, result_id="r1")]},
                "recorded_at": "2026-12-01T00:00:00Z",
            }
        ],
    }
    api = FakeApi({"/api/probes/sessions/s1": session, "/api/probes/sessions/s1/transcript": {"data": []}})
    html = show(sessions.ONE, api, session_id="s1")
    assert 'class="chart session-strip"' in html and 'data-verdict="fired"' in html
    capacity = {
        "armed": {
            "per_token": {"cost_ms": 0.5, "fillable_ms": 1.0, "fits": True, "source": "measured"},
            "per_1k_prompt": {"cost_ms": 3.0, "fillable_ms": 2.0, "fits": False, "source": "measured"},
            "probes": 1,
            "basis": "measured",
        },
        "limits": {},
    }
    api = FakeApi(
        {
            "/api/models": {"data": [{"id": "m", "state": "LOADED", "engine": "e", "format": "f"}]},
            "/api/models/m/probe-capacity": capacity,
        }
    )
    html = show(models.PAGE, api)
    assert 'class="chart budgets"' in html and html.count('<line class="budget"') == 2
