"""Operator code beside an armed probe: the chat never waits; the runner scores it after the response and the
stored result is revised in place (same result_id)."""

from __future__ import annotations

import time

import pytest

from millm_host.testing import chat as post_chat

BEHAVIOUR = "pii-code"

#: count(ptr, len): the number of "@" bytes in the text.
COUNT_AT = """(module (memory (export "memory") 1)
  (func (export "count") (param $p i32) (param $n i32) (result i32) (local $c i32)
    (block $done (loop $next
      (br_if $done (i32.eqz (local.get $n)))
      (if (i32.eq (i32.load8_u (local.get $p)) (i32.const 64))
        (then (local.set $c (i32.add (local.get $c) (i32.const 1)))))
      (local.set $p (i32.add (local.get $p) (i32.const 1)))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br $next)))
    (local.get $c)))"""
LOOP = '(module (memory (export "memory") 1) (func (export "count") (param i32 i32) (result i32) (loop (br 0)) (i32.const 0)))'

CODE_SET = {
    "format": "mi.ruleset/v1",
    "ruleset_id": "code-live",
    "version": "1",
    "signals": {
        "email": {"kind": "pattern", "pattern": r"\S+@\S+"},
        "ats": {"kind": "code_rule", "wat": COUNT_AT},
        "spin": {"kind": "code_rule", "wat": LOOP},
    },
    "expressions": {"at_signs": "ats", "email_or_at": {"any": ["email", "ats"]}, "emails": "email", "spinning": "spin"},
    "cases": [{"text": "a@b c@d", "expect": {"at_signs": 2}}],
}


@pytest.fixture(scope="module")
def server(app_factory, probe_model_dir, rulesets_env):
    # little fuel, a long wall time: the loop runs out of fuel (rule_resource_limit) well before its wall time,
    # even on a loaded machine (with the defaults, 200 ms of wall could end it first: rule_timeout)
    env = rulesets_env({"RULE_CODE_FUEL": "2000000", "RULE_CODE_CALL_WALL_MS": "5000"})
    return app_factory(plugins="all", checkpoint=probe_model_dir, env=env)


@pytest.fixture(scope="module")
def armed(server, lab):
    with server.http() as http:
        model_id = http.get("/api/health").json()["model"]
        identity = http.get(f"/api/models/{model_id}").json()
        doc = lab.definition(identity, name="code-watch", behaviour=BEHAVIOUR, windows=["prompt"])
        probe = http.post("/api/probes/import", json=doc)
        assert probe.status_code == 201, probe.text
        probe_id = probe.json()["id"]
        assert http.post(f"/api/probes/{probe_id}/arm", json={}).status_code == 200
        made = http.post("/api/rule-sets/import", json=CODE_SET)
        assert made.status_code == 201, made.text
        attach = http.put(f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals", json={"rule_set_id": made.json()["id"]})
        assert attach.status_code == 200, attach.text
        yield model_id
        http.post(f"/api/probes/{probe_id}/disarm")


def stored(http, result_id: str) -> dict:
    data = http.get("/api/probes/events", params={"result_id": result_id}).json()["data"]
    assert len(data) == 1
    return data[0]


def test_live_code_rules_are_skipped_then_revised_in_place(server, armed):
    body = {"messages": [{"role": "user", "content": "mail x@y.example or z@w.example"}], "max_tokens": 4}
    with server.http() as http:
        response = post_chat(http, armed, temperature=0, **body)
        assert response.status_code == 200, response.text
        live = {r["name"]: r for r in response.json()["millm_probe_verdicts"] if r["kind"] == "rule"}
        for name in ("at_signs", "email_or_at", "spinning"):  # the chat did not wait for operator code
            assert (live[name]["outcome"], live[name]["reason"]) == ("skipped", "rule_worker_unavailable")
            assert live[name]["fires"] is None and live[name]["count"] == 0
        assert live["emails"]["fires"] is True and live["emails"]["count"] == 2
        for _ in range(600):  # the runner scores after the response (bounded wait, no timing asserted)
            at = stored(http, live["at_signs"]["result_id"])
            spin = stored(http, live["spinning"]["result_id"])
            if at["status"] == "final" and spin["outcome"] == "failed":
                break
            time.sleep(0.05)
        assert (at["fires"], at["count"], at["outcome"], at["reason"]) == (True, 2, "completed", None)
        assert at["result_id"] == live["at_signs"]["result_id"] and "revised_at" in at
        either = stored(http, live["email_or_at"]["result_id"])
        assert either["status"] == "final" and either["count"] == 4
        assert (spin["reason"], spin["fires"]) == ("rule_resource_limit", None)
        assert stored(http, live["emails"]["result_id"])["count"] == 2  # decided live: unchanged
