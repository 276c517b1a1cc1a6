"""Pages rendered from canned API answers (no server, no browser): what they show, and that every
name from the server is text. The browser flows (``test_flows``) run the same pages on a real server."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from millm_webui.api_client import Answer, NeedsKey
from millm_webui.pages import PAGES, clusters, probes, sessions, steering
from millm_webui.render import render

HOSTILE = "<script>alert(1)</script>"


class FakeApi:
    """Answers GETs from a dict of path → body (404 for anything else), as the real ``Api`` does."""

    def __init__(self, answers: dict[str, Any], status: int = 200) -> None:
        self.answers, self.status = answers, status
        self.asked: list[str] = []

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Answer:
        self.asked.append(path)
        if self.status == 401:
            raise NeedsKey("the API key is not valid here")
        if path in self.answers:
            return Answer(200, self.answers[path])
        return Answer(404, {"error": {"message": f"no {path}"}})

    async def data(self, path: str, params: dict[str, Any] | None = None, default: Any = None) -> Any:
        answer = await self.get(path, params)
        return answer.data if answer.ok else default


class FakeReq:
    def __init__(self, **params: str) -> None:
        self.params = params
        self.path = "/ui/probes"

    def get_param(self, name: str) -> str | None:
        return self.params.get(name)


def run(coroutine) -> Any:
    """``asyncio.run`` on a thread of its own: Playwright's sync API may hold this thread's loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def show(page, api, **params) -> str:
    data = run(page.load(api, FakeReq(), **params))
    return render(page.template, nav=[p for p in PAGES if p.title], page=page, path=page.path, **data)


def probe(**changes: Any) -> dict[str, Any]:
    doc = {
        "id": "pr_1",
        "name": HOSTILE,
        "behaviour": None,
        "version": "1",
        "read": {"layer": 1, "hook_point": "resid_post"},
        "aggregation": {"rule": "mean"},
        "windows": ["all"],
        "decision": {"threshold": 0.5},
        "rung": None,
        "rung_language": None,
        "armed": False,
        "disarmed_reason": None,
    }
    return doc | changes


def test_a_probe_without_a_bar_is_listed_with_its_scores_and_no_threshold():
    """A definition may carry ``decision: null``; the page drew its chart from ``decision.threshold`` (a 500)."""
    events = {
        "data": [
            {
                "result_id": "r1",
                "probe_id": "pr_1",
                "kind": "probe",
                "score": 1.0,
                "verdict": None,
                "outcome": "completed",
                "window": "all",
                "recorded_at": "2026-12-01T00:00:00Z",
            }
        ]
    }
    api = FakeApi({"/api/probes": {"data": [probe(decision=None)]}, "/api/probes/events": events})
    html = show(probes.PAGE, api)
    assert "no threshold (the probe carries no bar)" in html
    assert "rung not stated" in html


def test_names_are_escaped():
    api = FakeApi({"/api/probes": {"data": [probe()]}})
    html = show(probes.PAGE, api)
    assert HOSTILE not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_feature_labels_are_shown_beside_indices_and_escaped():
    """Profiles, clusters and a label search show each feature's label (imported from Neuronpedia or SAELens)."""
    sae = {
        "sae_id": "res",
        "d_in": 64,
        "d_sae": 256,
        "hook_point": "blocks.0.hook_resid_post",
        "architecture": "standard",
        "k": None,
        "attached": [],
        "labels": 2,
    }
    labelled = [{"index": 12, "strength": 4.0, "label": "cats and kittens"}, {"index": 13, "strength": 1.0}]
    api = FakeApi(
        {
            "/api/saes": {"data": [sae]},
            "/api/steering": {"manual": [], "attached": []},
            "/api/profiles": {"data": [{"name": "p", "sae_id": "res", "layer": 0, "features": labelled}]},
            "/api/saes/res/labels": {
                "data": [{"index": 40, "label": HOSTILE, "explainer": "gpt-4o-mini", "method": "oai_token-act-pair"}],
                "has_more": True,
            },
        }
    )
    req = FakeReq(labels_sae="res", q="cert")
    data = run(steering.PAGE.load(api, req))
    html = render(steering.PAGE.template, nav=[], page=steering.PAGE, path=steering.PAGE.path, **data)
    assert '#12 <span class="feature-label">cats and kittens</span> × 4.0' in html and "#13 × 1.0" in html
    assert 'id="label-results"' in html and "More match" in html and "gpt-4o-mini · oai_token-act-pair" in html
    assert HOSTILE not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'id="import-labels"' in html
    cluster = {
        "cluster_id": "c",
        "name": "c",
        "sae_id": "res",
        "layer": 0,
        "features": labelled,
        "intensity": 1.0,
        "intensity_bounds": [0.0, 2.0],
        "intensity_range": None,
        "active": False,
        "live": False,
    }
    html = show(clusters.PAGE, FakeApi({"/api/clusters": {"data": [cluster]}}))
    assert '<span class="feature-label">cats and kittens</span>' in html


def test_without_an_sae_the_labels_card_says_what_to_do():
    api = FakeApi({"/api/saes": {"data": []}, "/api/profiles": {"data": []}})
    html = show(steering.PAGE, api)
    assert "Register an SAE first; then import its labels here." in html


@pytest.mark.parametrize(
    ("results", "colour"),
    [
        ([], "none"),
        ([{"verdict": True}, {"verdict": False}], "fired"),
        ([{"verdict": False}], "quiet"),
        ([{"verdict": None}], "error"),
        # a rule result carries fires and a count, never a verdict; pending (fires null) is not judged
        ([{"verdict": False}, {"kind": "rule", "fires": False, "count": 0}], "quiet"),
        ([{"verdict": False}, {"kind": "rule", "fires": True, "count": 2}], "fired"),
        ([{"verdict": False}, {"kind": "rule", "fires": None, "count": 0, "outcome": "skipped"}], "error"),
    ],
)
def test_a_timeline_cell_is_coloured_by_its_verdicts(results, colour):
    assert sessions.cell_verdict(results) == colour


def test_a_refused_key_shows_the_key_form_only():
    with pytest.raises(NeedsKey):
        run(probes.PAGE.load(FakeApi({}, status=401), FakeReq()))
    html = render("key.html", nav=[], page=probes.PAGE, path="/ui/probes", message="the API key is not valid here")
    assert "needs its admin key" in html and "results" not in html
