"""Every surface carries the same ``mi.probe.result/v1`` object, valid against the published schema."""

from __future__ import annotations

import json
import time
from pathlib import Path

import http_sfv
import jsonschema
import pytest

from millm_host.api import parse_list

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


def test_every_surface_validates(api, lab, identity, model_id, helpers, validator, header_validator):
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

    completed = api.post("/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 4})
    body = completed.json()["millm_probe_verdicts"]
    seen += body
    skipped = api.post("/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 2, "n": 2})
    seen += skipped.json()["millm_probe_verdicts"]
    for response in (completed, skipped):
        for obj in header_objects(response.headers["x-millm-probe-verdicts"]):
            header_validator.validate(obj)

    with api.stream(
        "POST", "/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 3, "stream": True}
    ) as stream:
        data = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
    [chunk] = [json.loads(d) for d in data[:-1] if "millm_probe_verdicts" in json.loads(d)]
    seen += chunk["millm_probe_verdicts"]

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
    while time.monotonic() < deadline and len(interrupted) < 5:
        interrupted = api.get("/api/probes/events", params={"trace_id": trace}).json()["data"]
        time.sleep(0.2)
    assert {e["outcome"] for e in interrupted} == {"interrupted"}
    seen += interrupted

    events = api.get("/api/probes/events", params={"limit": 50}).json()["data"]
    seen += events
    for obj in body:
        detail = api.get(f"/api/probes/events/{obj['result_id']}").json()
        text = detail.pop("detail")
        assert (text is not None) == (obj["fires"] is True)  # decoded context only where a result fired
        assert detail == obj  # the stored event is the object the response carried
        seen.append(detail)

    scored = api.post("/api/probes/score", json={"inputs": [{"text": "the sea"}, {"token_ids": [1, 2, 3]}]}).json()
    seen += [r for output in scored["results"] for r in output["results"]]

    outcomes = {(r["outcome"], r["status"]) for r in seen}
    assert {("completed", "final"), ("skipped", "final"), ("interrupted", "partial")} <= outcomes
    for obj in seen:
        validator.validate(obj)
