"""The rule-set API on an in-process app: validate writes nothing, import stores, evaluate, attach, restart."""

from __future__ import annotations

import copy

import pytest

from millm_host.testing import assert_error

#: What profiles, clusters and SAE ids refuse (issue 35, finding 4): hidden characters and paths.
UNSAFE_NAMES = [
    "nul\x00",
    "esc\x1b[31m",
    "bidi\u202eover",
    "zero\u200bwidth",
    "crlf\r\nX-Injected: 1",
    "../../etc/passwd",
    "..",
]


@pytest.fixture(scope="module")
def app(app_factory, rulesets_env):
    return app_factory(plugins=["rulesets"], env=rulesets_env())


@pytest.fixture
def http(app):
    with app.http() as client:
        yield client
        for attached in ("pii-behaviour",):
            client.delete(f"/api/probes/behaviours/{attached}/rule-signals")
        for s in client.get("/api/rule-sets").json()["data"]:
            client.delete(f"/api/rule-sets/{s['id']}")


def test_validate_writes_nothing(http, docs):
    r = http.post("/api/rule-sets/validate", json=docs.PII)
    assert r.status_code == 200, r.text
    assert r.json()["valid"] is True and r.json()["cases"] == len(docs.PII["cases"])
    assert http.get("/api/rule-sets").json()["data"] == []


def test_import_get_list_delete(http, docs):
    r = http.post("/api/rule-sets/import", json=docs.PII)
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["status"] == "published" and made["id"].startswith("rs_")
    assert [s["id"] for s in http.get("/api/rule-sets").json()["data"]] == [made["id"]]
    got = http.get(f"/api/rule-sets/{made['id']}").json()
    assert got["document"] == docs.PII
    again = http.post("/api/rule-sets/import", json=docs.PII)
    assert again.status_code == 409 and again.json()["error"]["code"] == "rule_set_exists"
    assert http.delete(f"/api/rule-sets/{made['id']}").json()["deleted"] is True
    assert http.get(f"/api/rule-sets/{made['id']}").status_code == 404


def test_refusals_are_openai_errors_naming_the_pointer(http, docs):
    doc = docs.pii()
    doc["signals"]["email"]["pattern"] = r"(\w+)\1"
    for route in ("validate", "import"):
        r = http.post(f"/api/rule-sets/{route}", json=doc)
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["code"] == "rule_pattern_refused" and error["param"] == "/signals/email/pattern"
    doc = docs.pii()
    doc["signals"]["custom"] = {"kind": "code_rule", "wat": "(module)"}
    doc["expressions"]["near"] = {"within_n": {"a": "custom", "b": "card", "n": 3}}
    error = http.post("/api/rule-sets/import", json=doc).json()["error"]
    assert error["code"] == "code_rule_in_within_n" and error["expression"] == "near"
    assert http.get("/api/rule-sets").json()["data"] == []


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_unsafe_names_are_refused_and_nothing_is_stored(http, docs, name):
    """ruleset_id, version, signal, expression and output column names: each refused, naming where."""
    renamed_signal = docs.pii()
    renamed_signal["signals"][name] = renamed_signal["signals"].pop("threat")
    renamed_signal["expressions"]["threat_words"] = {"signal": name}
    renamed_expression = docs.pii()
    renamed_expression["expressions"][name] = renamed_expression["expressions"].pop("no_threat")
    renamed_expression["cases"] = [c for c in renamed_expression["cases"] if "no_threat" not in c["expect"]]
    renamed_column = docs.pii()
    renamed_column["outputs"][0]["column"] = name
    renamed_column["cases"] = [{"text": "x", "expect": {}}]
    documents = {
        "/ruleset_id": docs.pii(ruleset_id=name),
        "/version": docs.pii(version=name),
        "/signals": renamed_signal,
        "/expressions": renamed_expression,
        "/outputs/0/column": renamed_column,
    }
    for param, document in documents.items():
        for route in ("validate", "import"):
            error = assert_error(http.post(f"/api/rule-sets/{route}", json=document), 400, "invalid_rule_set", param)
            assert repr(name) in error["message"], error  # escaped, never as sent
    assert http.get("/api/rule-sets").json()["data"] == []


def test_format_defaults_to_mi_ruleset_v1(http, docs):
    """The documented default (RuleSetDocument.format): a body without it is the same document."""
    document = docs.pii()
    del document["format"]
    checked = http.post("/api/rule-sets/validate", json=document)
    assert checked.status_code == 200, checked.text
    assert checked.json()["digest"] == http.post("/api/rule-sets/validate", json=docs.PII).json()["digest"]
    made = http.post("/api/rule-sets/import", json=document)
    assert made.status_code == 201, made.text
    assert http.get(f"/api/rule-sets/{made.json()['id']}").json()["document"]["format"] == "mi.ruleset/v1"
    assert_error(http.post("/api/rule-sets/validate", json=docs.pii(format="mi.ruleset/v2")), 400, "invalid_rule_set")


def test_a_set_failing_its_cases_is_refused(http, docs):
    doc = docs.pii()
    doc["cases"].append({"text": "nothing here", "expect": {"pii": True}})
    r = http.post("/api/rule-sets/import", json=doc)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "rule_set_cases_failed" and error["param"] == f"/cases/{len(doc['cases']) - 1}/expect/pii"
    assert error["failures"] == [
        {"case": len(doc["cases"]) - 1, "name": "pii", "expected": {"fires": True}, "got": {"fires": False, "count": 0}}
    ]


def test_a_set_whose_dataset_row_disagrees_with_a_case_is_refused_naming_the_column(http, docs):
    doc = docs.pii()
    doc["cases"][0]["outputs"]["has_pii"] = True  # the veto removes the test card: the row says False
    error = http.post("/api/rule-sets/validate", json=doc).json()["error"]
    assert error["code"] == "rule_set_cases_failed" and error["param"] == "/cases/0/outputs/has_pii"
    assert error["failures"] == [{"case": 0, "output": "has_pii", "expected": {"value": True}, "got": {"value": False}}]


def test_evaluate_returns_counts_and_spans_only_on_request(http, docs):
    made = http.post("/api/rule-sets/import", json=docs.PII).json()
    text = f"card {docs.CARD}, mail a@b.example"
    plain = http.post(f"/api/rule-sets/{made['id']}/evaluate", json={"text": text}).json()
    pii = next(r for r in plain["results"] if r["name"] == "pii")
    assert pii["kind"] == "rule" and pii["fires"] is True and pii["count"] == 2 and "spans" not in pii
    assert docs.CARD not in str(plain)  # never the matched text
    spans = http.post(
        f"/api/rule-sets/{made['id']}/evaluate", json={"text": text, "return_rule_positions": True}
    ).json()
    pii = next(r for r in spans["results"] if r["name"] == "pii")
    assert [text[s["start"] : s["end"]].strip(" ,") for s in pii["spans"]] == [docs.CARD, "a@b.example"]
    # the dataset view: the veto removed the test card; field columns (matched text) only with positions
    assert plain["vetoes"] == [{"index": 0, "when": "test_card", "fires": True, "removed": {"card": 1}}]
    assert plain["outputs"] == {"has_pii": True, "pii_count": 1, "cards": None, "email_text": None}
    assert spans["outputs"] == {"has_pii": True, "pii_count": 1, "cards": [], "email_text": ["a@b.example"]}
    real = http.post(
        f"/api/rule-sets/{made['id']}/evaluate",
        json={"text": f"card {docs.REAL_CARD}", "return_rule_positions": True},
    ).json()
    assert real["vetoes"][0]["fires"] is False and real["outputs"]["cards"] == [docs.REAL_CARD]
    bad = http.post(f"/api/rule-sets/{made['id']}/evaluate", json={"text": 3})
    assert bad.status_code == 400
    assert http.post("/api/rule-sets/rs_nothing/evaluate", json={"text": "x"}).status_code == 404


def test_attach_detach_and_delete_of_an_attached_set(http, docs):
    made = http.post("/api/rule-sets/import", json=docs.PII).json()
    r = http.put("/api/probes/behaviours/pii-behaviour/rule-signals", json={"rule_set_id": made["id"]})
    assert r.status_code == 200, r.text
    assert r.json()["rule_set"]["id"] == made["id"]
    assert http.get("/api/probes/behaviours/pii-behaviour/rule-signals").json()["rule_set"]["id"] == made["id"]
    refused = http.delete(f"/api/rule-sets/{made['id']}")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "rule_set_attached"
    missing = http.put("/api/probes/behaviours/pii-behaviour/rule-signals", json={"rule_set_id": "rs_none"})
    assert missing.status_code == 404
    assert http.delete("/api/probes/behaviours/pii-behaviour/rule-signals").json()["rule_set"] is None


def test_a_stored_set_this_build_disagrees_with_is_marked_vectors_failed_at_start(app_factory, docs, rulesets_env):
    """Re-proved at every start: a stored document whose case no longer holds stops being evaluated."""
    import json

    import sqlalchemy as sa

    first = app_factory(plugins=["rulesets"], env=rulesets_env())
    with first.http() as http:
        made = http.post("/api/rule-sets/import", json=docs.PII).json()
    broken = copy.deepcopy(docs.PII)
    broken["cases"][0]["expect"]["pii"] = False  # what a build with other semantics would disagree on
    with first.host.db.engine.begin() as connection:
        connection.execute(
            sa.text("UPDATE rule_sets SET document = :d WHERE id = :i"), {"d": json.dumps(broken), "i": made["id"]}
        )
    first.stop()
    first.start()  # a restart on the same data directory: startup re-proves every stored set
    with first.http() as http:
        got = http.get(f"/api/rule-sets/{made['id']}").json()
        assert got["status"] == "vectors_failed" and "cases disagree" in got["status_detail"]
        result = http.post(f"/api/rule-sets/{made['id']}/evaluate", json={"text": "x"}).json()["results"][0]
        assert result["reason"] == "rule_set_vectors_failed" and result["fires"] is None and result["count"] == 0
