"""Every surface carries the same ``mi.probe.result/v1`` object, valid against the published schema: probe
results and the rule results of the set attached to their behaviour, in one order (behaviour by behaviour,
each behaviour's rules beside its probes) on the header, the body, the stream, the events, stateless scoring
and a Batch output line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import http_sfv
import jsonschema
import pytest

from millm_host.api import parse_list
from millm_probes.serving import header

SCHEMA_PATH = Path(__file__).resolve().parents[3] / "docs" / "schemas" / "probe-result-v1.json"
CHAT = [{"role": "user", "content": "Describe the sea."}]
HEADER_FIELDS = {
    "score": "score",
    "threshold": "threshold",
    "verdict": "verdict",
    "rung": "rung",
    "window": "window",
    "behaviour": "behaviour",
    "probe": "probe_id",
    "reason": "reason",
    "scored": "scored",
    "kind": "kind",
    "fires": "fires",
    "count": "count",
}
#: A rule set for the ``sea`` behaviour: one expression, so each window adds one rule result.
SEA_RULES = {
    "format": "mi.ruleset/v1",
    "ruleset_id": "schema-sea",
    "version": "1",
    "signals": {"sea": {"kind": "pattern", "pattern": "(?i)sea"}},
    "expressions": {"sea_words": {"signal": "sea"}},
    "cases": [{"text": "the sea", "expect": {"sea_words": True}}],
}
HEADER_SET_FIELDS = {"set_armed": "armed_members", "set_total": "total_members", "complete": "complete"}


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def header_validator(validator):
    """The header carries a subset of the fields (and of the set block): each must still have the contract's type."""
    properties = dict(validator.schema["properties"])
    properties["set"] = {k: v for k, v in properties["set"].items() if k != "required"}
    properties["count"] = validator.schema["$defs"]["rule"]["properties"]["count"]  # a rule member's
    return jsonschema.Draft202012Validator({"type": "object", "properties": properties, "additionalProperties": False})


def header_objects(value: str) -> list[dict]:
    objects = []
    for member in parse_list(value):
        obj = {"name": member.value}
        for key, param in member.params.items():
            if key in HEADER_SET_FIELDS:
                obj.setdefault("set", {})[HEADER_SET_FIELDS[key]] = param
                continue
            obj[HEADER_FIELDS[key]] = (
                str(param)
                if isinstance(param, http_sfv.Token)
                else (float(param) if key in ("score", "threshold") else param)
            )
        objects.append(obj)
    return objects


def in_one_order(results: list[dict]) -> None:
    """Behaviour by behaviour (a probe naming none is its own group), each group's probes before its rules."""
    groups = [(r.get("behaviour") or r["name"], r["kind"]) for r in results]
    keys = [g for g, _ in groups]
    for key in set(keys):
        first, last = keys.index(key), len(keys) - 1 - keys[::-1].index(key)
        assert set(keys[first : last + 1]) == {key}, keys  # contiguous
        kinds = [kind for g, kind in groups if g == key]
        assert kinds == sorted(kinds, key=lambda k: k != "probe"), kinds


def batch_line_results(probes_server, model_id: str) -> list[dict]:
    """The results a Batch API output line carries for one chat."""
    client = probes_server.openai()
    line = {
        "custom_id": "sea",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model_id, "messages": CHAT, "max_tokens": 3},
    }
    source = client.files.create(file=("in.jsonl", (json.dumps(line) + "\n").encode()), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
    assert batch.status == "completed", batch
    [output] = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    return output["response"]["body"]["millm_probe_verdicts"]


@pytest.fixture
def sea_rules(api):
    """The ``sea`` rule set, attached to the ``sea`` behaviour; detached and deleted after the test."""
    imported = api.post("/api/rule-sets/import", json=SEA_RULES)
    assert imported.status_code == 201, imported.text
    rule_set_id = imported.json()["id"]
    attached = api.put("/api/probes/behaviours/sea/rule-signals", json={"rule_set_id": rule_set_id})
    assert attached.status_code == 200, attached.text
    yield rule_set_id
    api.delete("/api/probes/behaviours/sea/rule-signals")
    api.delete(f"/api/rule-sets/{rule_set_id}")


def test_every_surface_validates(
    api, lab, identity, model_id, helpers, validator, header_validator, sea_rules, probes_server
):
    probes = [
        helpers.import_probe(
            api,
            lab.definition(
                identity,
                name="schema-a",
                behaviour="sea",
                rule="attention",
                windows=["all", "prompt", "response", "last_user"],
            ),
        ),
        helpers.import_probe(api, lab.definition(identity, name="schema-b", threshold=None, layer=2, seed=5)),
    ]
    for probe in probes:
        helpers.arm(api, probe["id"])
    seen: list[dict] = []
    listings: list[list[dict]] = []  # every list of one request's results, as a surface carries it

    completed = api.post("/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 4})
    body = completed.json()["millm_probe_verdicts"]
    seen += body
    skipped = api.post("/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 2, "n": 2})
    seen += skipped.json()["millm_probe_verdicts"]
    listings += [body, skipped.json()["millm_probe_verdicts"]]
    for response in (completed, skipped):
        members = header_objects(response.headers["x-millm-probe-verdicts"])
        for obj in members:
            header_validator.validate(obj)
        in_one_order([{"kind": "probe", **m} for m in members])
        assert [m["name"] for m in members] == [r["name"] for r in response.json()["millm_probe_verdicts"]]

    with api.stream(
        "POST", "/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 3, "stream": True}
    ) as stream:
        data = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
    [chunk] = [json.loads(d) for d in data[:-1] if "millm_probe_verdicts" in json.loads(d)]
    seen += chunk["millm_probe_verdicts"]
    listings.append(chunk["millm_probe_verdicts"])

    trace = "5bf92f3577b34da6a3ce929d0e0e4736"
    with api.stream(
        "POST",
        "/v1/chat/completions",
        headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"},
        json={"model": model_id, "messages": CHAT, "max_tokens": 3000, "stream": True},
    ) as stream:
        for i, _ in enumerate(stream.iter_lines()):
            if i > 8:
                break
    deadline, interrupted = time.monotonic() + 30, []
    while time.monotonic() < deadline and len(interrupted) < 9:  # 5 probe results, 4 rule results
        interrupted = api.get("/api/probes/events", params={"trace_id": trace}).json()["data"]
        time.sleep(0.2)
    assert {e["outcome"] for e in interrupted} == {"interrupted"}
    seen += interrupted

    events = api.get("/api/probes/events", params={"limit": 50}).json()["data"]
    seen += events
    for obj in body:
        detail = api.get(f"/api/probes/events/{obj['result_id']}").json()
        text = detail.pop("detail")
        # decoded context only where a probe fired (a rule result never carries text)
        assert (text is not None) == (obj["kind"] == "probe" and obj["fires"] is True)
        assert detail == obj  # the stored event is the object the response carried
        seen.append(detail)

    scored = api.post("/api/probes/score", json={"inputs": [{"text": "the sea"}, {"token_ids": [1, 2, 3]}]}).json()
    seen += [r for output in scored["results"] for r in output["results"]]
    listings += [output["results"] for output in scored["results"]]

    batched = batch_line_results(probes_server, model_id)
    seen += batched
    listings.append(batched)

    # a behaviour whose attached set this process does not have: its rules are unknown, the probes decide
    runtime = probes_server.host.state["rulesets"]
    loaded = runtime.sets[sea_rules]
    runtime.drop(sea_rules)
    try:
        unknown = api.post("/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 2})
    finally:
        runtime.put(loaded)
    not_attached = [r for r in unknown.json()["millm_probe_verdicts"] if r["kind"] == "rule"]
    assert {(r["outcome"], r["reason"], r["name"]) for r in not_attached} == {
        ("skipped", "rule_set_not_attached", sea_rules)
    }
    assert len(not_attached) == 4  # one per window of the behaviour's probes
    seen += unknown.json()["millm_probe_verdicts"]

    outcomes = {(r["kind"], r["outcome"], r["status"]) for r in seen}
    assert {
        ("probe", "completed", "final"),
        ("probe", "skipped", "final"),
        ("probe", "interrupted", "partial"),
        ("rule", "completed", "final"),
        ("rule", "skipped", "unavailable"),
        ("rule", "interrupted", "unavailable"),
    } <= outcomes, outcomes
    for obj in seen:
        validator.validate(obj)
        if obj["kind"] == "rule":  # the behaviour's set block, as its probes carry it
            assert obj["set"] == next(r["set"] for r in body if r["behaviour"] == "sea")
    for listing in listings:
        in_one_order(listing)


def test_header_truncation_keeps_a_behaviours_rules_with_its_probes(api, lab, identity, model_id, helpers, sea_rules):
    for spec in (("trunc-sea", "sea"), ("trunc-air", "air")):
        helpers.arm(api, helpers.import_probe(api, lab.definition(identity, name=spec[0], behaviour=spec[1]))["id"])
    attached = api.put("/api/probes/behaviours/air/rule-signals", json={"rule_set_id": sea_rules})
    assert attached.status_code == 200, attached.text
    try:
        reply = api.post("/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 2})
    finally:
        api.delete("/api/probes/behaviours/air/rule-signals")
    results = reply.json()["millm_probe_verdicts"]
    assert [(r["behaviour"], r["kind"]) for r in results] == [
        ("air", "probe"),
        ("air", "rule"),
        ("sea", "probe"),
        ("sea", "rule"),
    ]
    full = header.render(results, 1 << 20)
    first_two = header.render(results[:2], 1 << 20)
    cut = header.render(results, len(first_two) + 60)  # room for the first behaviour, not for the second
    members = [m.value for m in parse_list(cut)]
    assert members == ["trunc-air", "sea_words", "..."], (cut, full)
