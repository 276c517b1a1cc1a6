"""Rule results on every surface of one real ``millm serve`` (a tiny model, the real engine): the session
timeline and the live feed carry them beside the probes (never the matched text); pending, skipped and
disabled rule results say why; the example detector reports beside the probes on ``POST /api/probes/score``.

The module's last test restarts the server with ``RULE_SIGNALS_ENABLED=false``.
"""

from __future__ import annotations

import json
import time

import pytest
from websockets.sync.client import connect

pytestmark = pytest.mark.slow

BEHAVIOUR = "pii"
WINDOWS = ["all", "prompt", "response"]

#: count(ptr, len): the number of "@" bytes in the text (operator code: live requests never wait for it).
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


@pytest.fixture(scope="module")
def server(server_factory, probe_model_dir, rulesets_env):
    # a generous rule budget: a loaded machine must not turn a decided result into rule_timeout
    env = {"RULE_TIME_BUDGET_MS": "10000", "DETECTOR_EXAMPLE_ENABLED": "true"}
    return server_factory(probe_model_dir, env=rulesets_env(env))


def arm_probe(http, lab, model_id: str) -> str:
    identity = http.get(f"/api/models/{model_id}").json()
    probe = http.post(
        "/api/probes/import", json=lab.definition(identity, name="pii-watch", behaviour=BEHAVIOUR, windows=WINDOWS)
    )
    assert probe.status_code == 201, probe.text
    assert http.post(f"/api/probes/{probe.json()['id']}/arm", json={}).status_code == 200
    return probe.json()["id"]


def attach(http, rule_set_id: str) -> None:
    attached = http.put(f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals", json={"rule_set_id": rule_set_id})
    assert attached.status_code == 200, attached.text


@pytest.fixture(scope="module")
def armed(server, lab, docs):
    with server.http() as http:
        probe_id = arm_probe(http, lab, server.model_id)
        rule_set = http.post("/api/rule-sets/import", json=docs.PII)
        assert rule_set.status_code == 201, rule_set.text
        attach(http, rule_set.json()["id"])
    return {"probe_id": probe_id, "rule_set_id": rule_set.json()["id"]}


def chat(http, model_id: str, content: str, headers: dict | None = None, **extra):
    body = {"model": model_id, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}
    response = http.post("/v1/chat/completions", json={"temperature": 0, **body}, headers=headers or {})
    assert response.status_code == 200, response.text
    return response


def by_kind(results, kind: str, window: str | None = None) -> dict[str, dict]:
    return {r["name"]: r for r in results if r["kind"] == kind and (window is None or r["window"] == window)}


def secret(docs) -> str:
    return f"My card is {docs.CARD}; mail me at jane@example.org"


def never_text(raw: str, docs) -> None:
    for matched in (docs.CARD, "jane@example.org", "My card is"):
        assert matched not in raw


def test_the_session_timeline_lists_rule_results_beside_the_probes(server, armed, docs):
    session = "rules-timeline-1"
    with server.http() as http:
        turns = [
            chat(http, server.model_id, secret(docs), headers={"X-miLLM-Session": session}),
            chat(http, server.model_id, "What a calm morning.", headers={"X-miLLM-Session": session}),
        ]
        assert {t.headers["x-millm-session-id"] for t in turns} == {session}
        timeline = http.get(f"/api/probes/sessions/{session}")
    assert timeline.status_code == 200, timeline.text
    got = timeline.json()
    column = next(c for c in got["columns"] if c["key"] == BEHAVIOUR)
    assert column["kind"] == "behaviour"
    assert column["rules"] == list(docs.PII["expressions"])  # the rule signals beside the behaviour's probes
    assert [row["turn"] for row in got["timeline"]] == [1, 2]
    fired = []
    for row, response in zip(got["timeline"], turns, strict=True):
        cell = row["cells"][BEHAVIOUR]
        # the cell holds what the response said, in its order: the probe's results, then the rules' beside them
        served = [r for r in response.json()["millm_probe_verdicts"] if r["behaviour"] == BEHAVIOUR]
        assert [r["result_id"] for r in cell] == [r["result_id"] for r in served]
        kinds = [r["kind"] for r in cell]
        assert kinds.index("rule") > max(i for i, k in enumerate(kinds) if k == "probe")
        assert "detector_example" in kinds  # another plugin's results (hook monitor_results) sit there too
        assert {r["window"] for r in cell if r["kind"] == "probe"} == set(WINDOWS)
        rules = by_kind(cell, "rule", "prompt")
        assert set(rules) == set(docs.PII["expressions"])
        fired.append((rules["pii"]["fires"], rules["pii"]["count"]))
    assert fired == [(True, 2), (False, 0)]  # the rule fired on the first turn (card and email), not the second
    never_text(timeline.text, docs)


def test_the_live_feed_carries_rule_results_and_no_text(server, armed, docs):
    url = server.base_url.replace("http://", "ws://") + "/api/probes/feed"
    with (
        connect(url) as everything,
        connect(url + f"?behaviour={BEHAVIOUR}&fired=true") as fired_only,
        server.http() as http,
    ):
        response = chat(http, server.model_id, secret(docs), headers={"X-miLLM-Session": "rules-feed-1"})
        raw = everything.recv(timeout=60)
        filtered = json.loads(fired_only.recv(timeout=60))
    never_text(raw, docs)
    message = json.loads(raw)
    assert (message["session_id"], message["turn"]) == ("rules-feed-1", 1)
    served = response.json()["millm_probe_verdicts"]
    assert [r["result_id"] for r in message["results"]] == [r["result_id"] for r in served]  # the header's order
    rule = by_kind(message["results"], "rule", "prompt")["pii"]
    assert (rule["fires"], rule["count"], rule["behaviour"]) == (True, 2, BEHAVIOUR)
    # a behaviour's fired-only filter keeps its firing rule results
    assert {(r["kind"], r["fires"]) for r in filtered["results"]} >= {("rule", True)}
    assert all(r["fires"] is True and r["behaviour"] == BEHAVIOUR for r in filtered["results"])


def test_judge_traffic_and_an_unscored_request_skip_rules_with_the_probes_reason(server, armed, docs):
    with server.http() as http:
        judged = chat(http, server.model_id, secret(docs), headers={"X-miLLM-Origin": "judge"})
        batched = chat(http, server.model_id, secret(docs), n=2)  # n > 1: not scored (batched_request)
    for response, reason in ((judged, "judge_traffic"), (batched, "batched_request")):
        results = response.json()["millm_probe_verdicts"]
        probes = [r for r in results if r["kind"] == "probe"]
        rules = [r for r in results if r["kind"] == "rule"]
        assert probes and {(r["outcome"], r["reason"]) for r in probes} == {("skipped", reason)}
        assert len(rules) == len(WINDOWS) * len(docs.PII["expressions"])
        assert {(r["outcome"], r["reason"], r["status"], r["fires"], r["count"]) for r in rules} == {
            ("skipped", reason, "unavailable", None, 0)
        }
        never_text(response.text, docs)


def test_pending_operator_code_is_unavailable_then_revised_in_place(server, armed, lab):
    code_set = {
        "format": "mi.ruleset/v1",
        "ruleset_id": "code-pending",
        "version": "1",
        "signals": {"ats": {"kind": "code_rule", "wat": COUNT_AT}, "email": {"kind": "pattern", "pattern": r"\S+@\S+"}},
        "expressions": {"at_signs": "ats", "emails": "email"},
        "cases": [{"text": "a@b c@d", "expect": {"at_signs": 2}}],
    }
    with server.http() as http:
        made = http.post("/api/rule-sets/import", json=code_set)
        assert made.status_code == 201, made.text
        attach(http, made.json()["id"])
        try:
            headers = {"X-miLLM-Session": "rules-pending-1"}
            response = chat(http, server.model_id, "mail x@y.example or z@w.example", headers=headers)
            pending = by_kind(response.json()["millm_probe_verdicts"], "rule", "prompt")
            at = pending["at_signs"]  # the chat did not wait for operator code
            assert (at["status"], at["fires"], at["count"]) == ("unavailable", None, 0)
            assert (at["outcome"], at["reason"]) == ("skipped", "rule_worker_unavailable")
            assert (pending["emails"]["fires"], pending["emails"]["count"]) == (True, 2)
            for _ in range(600):  # the runner scores after the response (bounded wait, no timing asserted)
                stored = http.get("/api/probes/events", params={"result_id": at["result_id"]}).json()["data"]
                if stored and stored[0]["status"] == "final":
                    break
                time.sleep(0.05)
            assert (stored[0]["fires"], stored[0]["count"], stored[0]["reason"]) == (True, 2, None)
            # the session timeline shows the revision (same result_id)
            cell = http.get("/api/probes/sessions/rules-pending-1").json()["timeline"][0]["cells"][BEHAVIOUR]
            revised = next(r for r in cell if r["result_id"] == at["result_id"])
            assert (revised["status"], revised["fires"], revised["count"]) == ("final", True, 2)
        finally:
            attach(http, armed["rule_set_id"])


def test_the_example_detector_reports_beside_the_probes_on_probe_score(server, armed):
    with server.http() as http:
        scored = http.post(
            "/api/probes/score",
            json={"behaviours": [BEHAVIOUR], "inputs": [{"text": "STOP SHOUTING AT ME"}, {"text": "a quiet word"}]},
        )
    assert scored.status_code == 200, scored.text
    loud, quiet = (entry["results"] for entry in scored.json()["results"])
    shouting = []
    for results in (loud, quiet):
        probes = {r["window"]: r for r in results if r["kind"] == "probe"}
        detected = {r["window"]: r for r in results if r["kind"] == "detector_example"}
        assert set(detected) == set(probes) == set(WINDOWS)  # one per window the behaviour's probes report
        assert all(r["behaviour"] == BEHAVIOUR and r["name"] == "shouting" for r in detected.values())
        for window, probe in probes.items():  # an unscored window carries the probes' reason
            assert (detected[window]["fires"] is None) == (probe["fires"] is None)
            assert detected[window]["reason"] == probe["reason"]
        assert detected["prompt"]["outcome"] == "completed"
        shouting.append(detected["prompt"]["score"])
        # listed after the probes' own (the hook's results follow the probes')
        kinds = [r["kind"] for r in results]
        assert kinds.index("detector_example") > max(i for i, k in enumerate(kinds) if k == "probe")
    # the tiny model's tokenizer decodes the text its own way: compare the two inputs, not a fixed score
    assert shouting[0] > shouting[1]


def test_rule_signals_disabled_reports_its_reason_and_keeps_the_attachment(server, armed, lab, docs):
    server.env["RULE_SIGNALS_ENABLED"] = "false"
    server.restart()
    with server.http() as http:
        view = http.get(f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals").json()
        assert view["enabled"] is False and view["rule_set"]["id"] == armed["rule_set_id"]  # kept
        assert http.post(f"/api/probes/{armed['probe_id']}/arm", json={}).status_code == 200  # a restart disarms
        response = chat(http, server.model_id, secret(docs))
    results = response.json()["millm_probe_verdicts"]
    rules = [r for r in results if r["kind"] == "rule"]
    assert len(rules) == len(WINDOWS) * len(docs.PII["expressions"])
    assert {(r["reason"], r["status"], r["fires"], r["count"]) for r in rules} == {
        ("rule_signals_disabled", "unavailable", None, 0)
    }
    assert {r["outcome"] for r in results if r["kind"] == "probe"} == {"completed"}
