"""``GET /api/probes/events/counts``: each probe's stored results and how many fired, every one of them
(not a page), under the events list's filters."""

from __future__ import annotations

import pytest

from millm_host.testing import assert_error

WINDOWS = ["all", "prompt", "response", "last_user"]


@pytest.fixture
def armed(api, lab, identity, helpers):
    doc = lab.definition(identity, name="counted", rule="mean", windows=WINDOWS, threshold=0.0, seed=5)
    probe = helpers.import_probe(api, doc)
    helpers.arm(api, probe["id"])
    return probe["id"]


def listed(api, **params) -> list[dict]:
    """Every stored result the events list gives under ``params``, paged to its end."""
    found: list[dict] = []
    while True:
        page = api.get(
            "/api/probes/events", params={"limit": 2, **params, **({"after": found[-1]["result_id"]} if found else {})}
        )
        assert page.status_code == 200, page.text
        found += page.json()["data"]
        if not page.json()["has_more"]:
            return found


def test_counts_are_every_stored_result_under_the_filters(api, armed, model_id):
    for i in range(3):
        chat = {"model": model_id, "messages": [{"role": "user", "content": f"count {i}"}], "max_tokens": 2}
        assert api.post("/v1/chat/completions", json=chat).status_code == 200
    for filters in ({}, {"window": "all"}, {"fired": "true"}, {"fired": "false", "window": "prompt"}):
        counts = api.get("/api/probes/events/counts", params={"probe_id": armed, **filters})
        assert counts.status_code == 200, counts.text
        results = listed(api, probe_id=armed, **filters)
        expected = [{"probe_id": armed, "results": len(results), "fired": sum(1 for r in results if r["fires"])}]
        assert counts.json() == {"object": "list", "data": expected if results else []}, filters
    every = api.get("/api/probes/events/counts").json()["data"]
    assert {"probe_id": armed, "results": 12, "fired": listed_fired(api, armed)} in every
    assert_error(api.get("/api/probes/events/counts", params={"window": "nope"}), 400, "invalid_parameter", "window")


def listed_fired(api, probe_id: str) -> int:
    return sum(1 for r in listed(api, probe_id=probe_id) if r["fires"])
