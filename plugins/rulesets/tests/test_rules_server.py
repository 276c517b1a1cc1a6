"""Rule signals on an app of their own, in-process (a tiny model, the real engine): the PII set attached to
an armed probe's behaviour reports beside the probe on a chat, on ``POST /api/probes/score`` and on Batch
lines (the openai SDK's files and batches), and ``evaluate`` gives the set's dataset view (its veto and
output columns)."""

from __future__ import annotations

import json
import time

import pytest

from millm_host.api import parse_list

pytestmark = pytest.mark.slow

BEHAVIOUR = "pii"
WINDOWS = ["all", "prompt", "response"]


@pytest.fixture(scope="module")
def server(app_factory, probe_model_dir, rulesets_env):
    # a generous rule budget: on a loaded test machine a 20 ms budget can run out (rule_timeout) on one
    # request and not on the next, and these tests compare two requests' rule results
    env = {"MILLM_BATCH_CONCURRENCY": "1", "RULE_TIME_BUDGET_MS": "10000"}
    return app_factory(plugins="all", checkpoint=probe_model_dir, env=rulesets_env(env))


@pytest.fixture(scope="module")
def armed(server, lab, docs):
    with server.http() as http:
        identity = http.get(f"/api/models/{server.model_id}").json()
        probe = http.post(
            "/api/probes/import", json=lab.definition(identity, name="pii-watch", behaviour=BEHAVIOUR, windows=WINDOWS)
        )
        assert probe.status_code == 201, probe.text
        assert http.post(f"/api/probes/{probe.json()['id']}/arm", json={}).status_code == 200
        rule_set = http.post("/api/rule-sets/import", json=docs.PII)
        assert rule_set.status_code == 201, rule_set.text
        attach = http.put(
            f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals", json={"rule_set_id": rule_set.json()["id"]}
        )
        assert attach.status_code == 200, attach.text
    return {"probe_id": probe.json()["id"], "rule_set_id": rule_set.json()["id"]}


def rule_view(results):
    """What a rule result says, without what differs from one request to the next (ids, times)."""
    return sorted(
        (r["name"], r["window"], r["outcome"], r["reason"], r["fires"], r["count"], r["behaviour"])
        for r in results
        if r["kind"] == "rule"
    )


def secret(docs) -> str:
    return f"My card is {docs.CARD}, my other card {docs.REAL_CARD}; mail me at jane@example.org"


def test_evaluate_gives_the_veto_and_the_output_row(server, armed, docs):
    with server.http() as http:
        got = http.post(
            f"/api/rule-sets/{armed['rule_set_id']}/evaluate",
            json={"text": secret(docs), "return_rule_positions": True},
        ).json()
    pii = next(r for r in got["results"] if r["name"] == "pii")
    assert (pii["fires"], pii["count"]) == (True, 3)  # as served beside probes: no veto
    assert got["vetoes"] == [{"index": 0, "when": "test_card", "fires": True, "removed": {"card": 1}}]
    assert got["outputs"] == {
        "has_pii": True,
        "pii_count": 2,
        "cards": [docs.REAL_CARD],
        "email_text": ["jane@example.org"],
    }


def test_batch_lines_carry_the_rule_results_a_live_request_would(server, armed, docs):
    chat = {
        "model": server.model_id,
        "messages": [{"role": "user", "content": secret(docs)}],
        "max_tokens": 4,
        "temperature": 0,
    }
    completion = {"model": server.model_id, "prompt": secret(docs), "max_tokens": 4, "temperature": 0}
    requests = {"chat-1": ("/v1/chat/completions", chat), "completion-1": ("/v1/completions", completion)}
    client = server.openai()
    live = {}
    with server.http() as http:
        for custom_id, (url, body) in requests.items():
            reply = http.post(url, json=body)
            assert reply.status_code == 200, reply.text
            live[custom_id] = reply.json()["millm_probe_verdicts"]
    batches = {}
    for custom_id, (url, body) in requests.items():  # a batch has one endpoint
        record = json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})
        source = client.files.create(file=("in.jsonl", (record + "\n").encode()), purpose="batch")
        batches[custom_id] = client.batches.create(input_file_id=source.id, endpoint=url, completion_window="24h")
    deadline = time.monotonic() + 600
    for custom_id, batch in batches.items():
        while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "cancelled"):
            assert time.monotonic() < deadline, batch
            time.sleep(0.2)
        assert batch.status == "completed" and batch.request_counts.completed == 1, batch
        (output,) = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
        assert output["custom_id"] == custom_id
        response = output["response"]
        assert response["status_code"] == 200
        results = response["body"]["millm_probe_verdicts"]
        assert rule_view(results) == rule_view(live[custom_id])  # as the same live request
        prompt = {r["name"]: r for r in results if r["kind"] == "rule" and r["window"] == "prompt"}
        assert (prompt["pii"]["fires"], prompt["pii"]["count"]) == (True, 3), custom_id
        headers = {k.lower(): v for k, v in response["millm"]["headers"].items()}
        members = parse_list(headers["x-millm-probe-verdicts"])
        rule_members = [(m.value, dict(m.params)) for m in members if str(m.params.get("kind")) == "rule"]
        assert len(rule_members) == len([r for r in results if r["kind"] == "rule"])
        assert any(
            name == "pii" and str(p["window"]) == "prompt" and p["fires"] is True and p["count"] == 3
            for name, p in rule_members
        )
        assert not any(docs.CARD in json.dumps(r) for r in results)  # never the matched text
        with server.http() as http:  # stored: the events list has the batch line's results too
            stored = http.get("/api/probes/events", params={"trace_id": results[0]["trace_id"]}).json()["data"]
        assert {r["result_id"] for r in stored} == {r["result_id"] for r in results}


def test_probe_score_carries_the_rule_results(server, armed, docs):
    with server.http() as http:
        scored = http.post(
            "/api/probes/score",
            json={"behaviours": [BEHAVIOUR], "inputs": [{"text": secret(docs)}]},
        )
    assert scored.status_code == 200, scored.text
    results = scored.json()["results"][0]["results"]
    rules = {(r["name"], r["window"]): r for r in results if r["kind"] == "rule"}
    assert (rules["pii", "all"]["fires"], rules["pii", "all"]["count"]) == (True, 3)
    assert rules["pii", "all"]["persistence"] == "not_persisted"
    for matched in (docs.CARD, docs.REAL_CARD, "jane@example.org"):
        assert matched not in scored.text


def test_what_needs_a_code_rules_positions_is_refused_in_order_and_nothing_is_stored(server, docs):
    """D65/D74 on import: within_n, then anchor/span_of, then the veto's when and removes, then field outputs."""
    code = {
        "kind": "code_rule",
        "wat": '(module (memory (export "memory") 1) (func (export "count") '
        "(param i32 i32) (result i32) (i32.const 0)))",
    }
    steps = [
        (
            "expressions",
            {"near": {"within_n": {"a": "card", "b": "custom", "n": 5}}},
            "code_rule_in_within_n",
            {"expression": "near"},
        ),
        (
            "signals",
            {"v": {"kind": "validator", "validator": "luhn", "span_of": "custom"}},
            "code_rule_positions_needed",
            {"signal": "v", "use": "span_of"},
        ),
        (
            "vetoes",
            [{"when": "card", "removes": ["custom"]}],
            "code_rule_positions_needed",
            {"veto": 0, "use": "veto_removes"},
        ),
        (
            "outputs",
            [{"column": "code_text", "use": "field", "of": "custom"}],
            "code_rule_positions_needed",
            {"column": "code_text", "use": "field"},
        ),
    ]
    with server.http() as http:
        before = [s["id"] for s in http.get("/api/rule-sets").json()["data"]]
        for i in range(len(steps)):
            doc = docs.pii(ruleset_id=f"refused-{i}", cases=[])
            doc["signals"]["custom"] = code
            for key, value, _, _ in steps[i:]:
                if isinstance(value, dict):
                    doc[key] = {**doc[key], **value}
                else:
                    doc[key] = value
            error = http.post("/api/rule-sets/import", json=doc).json()["error"]
            _, _, code_name, named = steps[i]
            assert error["code"] == code_name, (i, error)
            assert {k: error[k] for k in named} == named
        assert [s["id"] for s in http.get("/api/rule-sets").json()["data"]] == before  # nothing stored
