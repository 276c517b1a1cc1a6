"""Rule signals beside an armed probe, end to end through chats on a tiny model (the real engine).

A PII set (cards with Luhn, IBANs with mod97, an email pattern, a word list and a
proximity cue) attached to the probe's behaviour reports kind "rule" results on
the header, the body, the stream and the events list; never the matched text.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from millm_host.api import parse_list
from millm_host.testing import chat as post_chat, stream_post

BEHAVIOUR = "pii"
WINDOWS = ["all", "prompt", "response"]


@pytest.fixture(scope="module")
def server(app_factory, probe_model_dir, rulesets_env):
    return app_factory(plugins="all", checkpoint=probe_model_dir, env=rulesets_env())


@pytest.fixture(scope="module")
def model_id(server):
    with server.http() as http:
        return http.get("/api/health").json()["model"]


@pytest.fixture(scope="module")
def armed(server, model_id, lab, docs):
    """One armed probe of behaviour ``pii`` and the PII set attached to that behaviour."""
    with server.http() as http:
        identity = http.get(f"/api/models/{model_id}").json()
        doc = lab.definition(identity, name="pii-watch", behaviour=BEHAVIOUR, windows=WINDOWS)
        probe = http.post("/api/probes/import", json=doc)
        assert probe.status_code == 201, probe.text
        probe_id = probe.json()["id"]
        assert http.post(f"/api/probes/{probe_id}/arm", json={}).status_code == 200
        rule_set = http.post("/api/rule-sets/import", json=docs.PII).json()
        attach = http.put(f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals", json={"rule_set_id": rule_set["id"]})
        assert attach.status_code == 200, attach.text
        yield {"probe_id": probe_id, "rule_set_id": rule_set["id"]}
        http.post(f"/api/probes/{probe_id}/disarm")


def chat(http, model_id, content, headers=None, **extra):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0, **extra}
    response = post_chat(http, model_id, headers=headers, **body)
    assert response.status_code == 200, response.text
    return response


def rules(results, window=None):
    return {r["name"]: r for r in results if r["kind"] == "rule" and (window is None or r["window"] == window)}


def test_a_pii_chat_reports_rule_results_beside_the_probe(server, model_id, armed, docs):
    secret = f"My card is {docs.CARD} and my IBAN is {docs.IBAN}, mail me at jane@example.org"
    with server.http() as http:
        response = chat(http, model_id, secret)
    results = response.json()["millm_probe_verdicts"]
    probes = [r for r in results if r["kind"] == "probe"]
    assert {r["window"] for r in probes} == set(WINDOWS)
    assert all(r["outcome"] == "completed" for r in probes)  # a rule result never changes a probe result
    prompt = rules(results, "prompt")
    assert prompt["pii"]["fires"] is True and prompt["pii"]["count"] == 3  # card, IBAN, email
    assert prompt["iban_valid"]["fires"] is True
    assert prompt["threat_words"]["fires"] is False and prompt["threat_words"]["count"] == 0
    assert prompt["pii"]["behaviour"] == BEHAVIOUR and prompt["pii"]["probe_id"] is None
    assert prompt["pii"]["rule_set_id"] == armed["rule_set_id"]
    assert rules(results, "all")["pii"]["fires"] is True
    assert set(rules(results, "response")) == set(docs.PII["expressions"])  # every expression, every window
    text = response.text
    for matched in (docs.CARD, docs.IBAN, "jane@example.org"):
        assert matched not in text  # never the matched text
    # the header lists the same results, the rule ones by name with kind, fires and count
    members = parse_list(response.headers["X-miLLM-Probe-Verdicts"])
    rule_members = [(m.value, dict(m.params)) for m in members if str(m.params.get("kind")) == "rule"]
    assert len(rule_members) == len([r for r in results if r["kind"] == "rule"])
    pii_prompt = next(p for name, p in rule_members if name == "pii" and str(p["window"]) == "prompt")
    assert pii_prompt["fires"] is True and pii_prompt["count"] == 3
    # stored: the events list carries them, same result_id
    with server.http() as http:
        stored = http.get("/api/probes/events", params={"trace_id": results[0]["trace_id"]}).json()["data"]
    assert {r["result_id"] for r in stored} == {r["result_id"] for r in results}
    # /metrics counts them by expression and outcome
    with server.http() as http:
        scraped = http.get("/metrics").text
    counted = {
        (sample.labels["signal"], sample.labels["outcome"]): sample.value
        for family in text_string_to_metric_families(scraped)
        if family.name == "millm_rule_results"
        for sample in family.samples
        if sample.name == "millm_rule_results_total"
    }
    assert counted[("pii", "fired")] >= 2 and counted[("threat_words", "clear")] >= 3


def test_the_stream_carries_rule_results_on_its_finish_chunk(server, model_id, armed, docs):
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": f"card {docs.CARD}"}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
    }
    with server.http() as http:
        _, events = stream_post(http, "/v1/chat/completions", body)
    finals = [e for e in events if isinstance(e, dict) and "millm_probe_verdicts" in e]
    assert len(finals) == 1
    got = rules(finals[0]["millm_probe_verdicts"], "prompt")
    assert got["pii"]["fires"] is True and got["pii"]["count"] == 1


def test_judge_traffic_skips_rules_with_the_probes_reason(server, model_id, armed, docs):
    with server.http() as http:
        response = chat(http, model_id, f"card {docs.CARD}", headers={"X-miLLM-Origin": "judge"})
    got = [r for r in response.json()["millm_probe_verdicts"] if r["kind"] == "rule"]
    assert got and {(r["outcome"], r["reason"], r["status"]) for r in got} == {
        ("skipped", "judge_traffic", "unavailable")
    }
    assert {(r["fires"], r["count"]) for r in got} == {(None, 0)}


def test_a_behaviour_without_an_attached_set_reports_no_rules(server, model_id, armed, docs):
    with server.http() as http:
        http.delete(f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals")
        try:
            response = chat(http, model_id, f"card {docs.CARD}")
        finally:
            http.put(f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals", json={"rule_set_id": armed["rule_set_id"]})
    assert [r for r in response.json()["millm_probe_verdicts"] if r["kind"] == "rule"] == []


LENGTH = '(module (memory (export "memory") 1) (func (export "count") (param i32 i32) (result i32) (local.get 1)))'


def test_probe_score_reports_rule_results_beside_the_probes(server, model_id, armed, docs):
    """POST /api/probes/score: a scored behaviour's rule signals follow each input's probe results, as on live
    traffic (kind rule, fires and count, never the matched text), not stored; they never change a probe result."""
    secret = f"My card is {docs.CARD} and my IBAN is {docs.IBAN}, mail me at jane@example.org"
    body = {
        "behaviours": [BEHAVIOUR],
        "inputs": [
            {"messages": [{"role": "user", "content": secret}, {"role": "assistant", "content": "noted"}]},
            {"token_ids": [1, 2, 3]},  # no turns: prompt and response cannot be read, so neither can their rules
        ],
    }
    with server.http() as http:
        scored = http.post("/api/probes/score", json=body)
        assert scored.status_code == 200, scored.text
        http.delete(f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals")
        try:
            bare = http.post("/api/probes/score", json=body).json()
        finally:
            http.put(f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals", json={"rule_set_id": armed["rule_set_id"]})
    first, second = scored.json()["results"]
    prompt = rules(first["results"], "prompt")
    assert set(prompt) == set(docs.PII["expressions"])
    assert prompt["pii"]["fires"] is True and prompt["pii"]["count"] == 3  # card, IBAN, email
    assert rules(first["results"], "response")["pii"]["fires"] is False
    assert {r["persistence"] for r in first["results"] if r["kind"] == "rule"} == {"not_persisted"}
    assert all(r["behaviour"] == BEHAVIOUR and r["probe_id"] is None for r in rules(first["results"]).values())
    for matched in (docs.CARD, docs.IBAN, "jane@example.org"):
        assert matched not in scored.text  # never the matched text
    kinds = [r["kind"] for r in first["results"]]
    assert kinds == sorted(kinds, key=lambda k: k != "probe")  # the probes' own first

    # a rule result never changes a probe result: the same probe results without the set attached
    def probe_part(output):
        return [
            (r["probe_id"], r["window"], r["outcome"], r["score"], r["fires"])
            for r in output["results"]
            if r["kind"] == "probe"
        ]

    assert [probe_part(o) for o in scored.json()["results"]] == [probe_part(o) for o in bare["results"]]
    assert all(r["kind"] == "probe" for o in bare["results"] for r in o["results"])
    # the second input has no turns: its prompt window is skipped with the probes' own reason
    probe_prompt = next(r for r in second["results"] if r["kind"] == "probe" and r["window"] == "prompt")
    rule_prompt = rules(second["results"], "prompt")["pii"]
    assert (rule_prompt["outcome"], rule_prompt["reason"]) == (probe_prompt["outcome"], probe_prompt["reason"])
    assert (rule_prompt["fires"], rule_prompt["count"], rule_prompt["status"]) == (None, 0, "unavailable")


def test_probe_score_waits_for_operator_code(server, model_id, lab, docs):
    """The stateless route asks the rule runner: a code rule is decided there, not skipped as on a live chat."""
    doc = {
        "format": "mi.ruleset/v1",
        "ruleset_id": "length-score",
        "version": "1",
        "signals": {
            "custom": {"kind": "code_rule", "wat": LENGTH},
            "email": {"kind": "pattern", "pattern": r"\S+@\S+"},
        },
        "expressions": {"bytes": "custom", "either": {"any": ["custom", "email"]}},
        "cases": [{"text": "abc", "expect": {"bytes": 3}}],
    }
    with server.http() as http:
        identity = http.get(f"/api/models/{model_id}").json()
        definition = lab.definition(identity, name="counted-watch", behaviour="counted", windows=["all"])
        probe = http.post("/api/probes/import", json=definition)
        assert probe.status_code == 201, probe.text
        made = http.post("/api/rule-sets/import", json=doc)
        assert made.status_code == 201, made.text
        attach = http.put("/api/probes/behaviours/counted/rule-signals", json={"rule_set_id": made.json()["id"]})
        assert attach.status_code == 200, attach.text
        try:
            scored = http.post("/api/probes/score", json={"behaviours": ["counted"], "inputs": [{"text": "héllo"}]})
        finally:
            http.delete("/api/probes/behaviours/counted/rule-signals")
            http.delete(f"/api/probes/{probe.json()['id']}")
    assert scored.status_code == 200, scored.text
    got = rules(scored.json()["results"][0]["results"], "all")
    assert got["bytes"]["outcome"] == "completed" and got["bytes"]["fires"] is True
    assert got["bytes"]["count"] > len("héllo")  # the whole window's UTF-8 bytes, template included
    assert got["either"]["fires"] is True
