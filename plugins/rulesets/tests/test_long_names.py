"""Names up to what the tables hold are stored on every database; longer ones are a 400, never a 500.

SQLite ignores a VARCHAR's length and PostgreSQL enforces it, so these run on both (``pytest -m storage``).
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def app(app_factory, rulesets_env):
    return app_factory(plugins=["rulesets"], env=rulesets_env())


def test_ruleset_ids_versions_and_behaviour_keys_at_and_past_their_limits(app, docs):
    with app.http() as http:
        for field, length in (("ruleset_id", 201), ("version", 101)):
            r = http.post("/api/rule-sets/import", json=docs.pii(**{field: "é" * length}))
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == f"/{field}"
        r = http.post("/api/rule-sets/import", json=docs.pii(ruleset_id="é" * 200, version="😀" * 100))
        assert r.status_code == 201, r.text
        made = r.json()["id"]
        longest = "🚨" * 200
        r = http.put(f"/api/probes/behaviours/{'🚨' * 201}/rule-signals", json={"rule_set_id": made})
        assert r.status_code == 400 and r.json()["error"]["param"] == "key", r.text
        r = http.put(f"/api/probes/behaviours/{longest}/rule-signals", json={"rule_set_id": made})
        assert r.status_code == 200, r.text
        assert http.get(f"/api/probes/behaviours/{longest}/rule-signals").json()["rule_set"]["id"] == made
        http.delete(f"/api/probes/behaviours/{longest}/rule-signals")
        http.delete(f"/api/rule-sets/{made}")
