"""Transcripts and retention: text kept only when asked, served by one route, removed by a background pass."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from millm_host.testing import chat as post_chat


@pytest.fixture(scope="module")
def recording(app_factory, probe_model_dir, identity, lab, helpers):
    """An app keeping transcripts (at most one turn's), sweeping every 0.1 s, ending idle sessions at once."""
    app = app_factory(
        plugins="all",
        models={},
        model=str(probe_model_dir),
        env={
            "PROBE_TRANSCRIPTS": "true",
            "PROBE_TRANSCRIPT_MAX_TURNS": "1",
            "PROBE_RETENTION_INTERVAL_S": "0.1",
            "PROBE_SESSION_IDLE_MINUTES": "0.00001",
        },
    )
    with app.http() as http:
        probe = helpers.import_probe(http, lab.definition(identity, name="kept", threshold=-1e9, seed=8))
        helpers.arm(http, probe["id"])
    return app


def converse(http, model_id, messages, headers=None):
    response = post_chat(http, model_id, headers=headers, messages=messages, max_tokens=4, temperature=0)
    assert response.status_code == 200, response.text
    return response


def test_a_turn_keeps_the_newest_user_message_and_the_visible_reply(recording):
    name = f"t-{uuid.uuid4().hex}"
    model_id = recording.model_id
    with recording.http() as http:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
        response = converse(http, model_id, messages, headers={"X-miLLM-Session": name})
        assert response.headers["x-millm-transcript"] == "recorded"
        reply = response.json()["choices"][0]["message"]["content"]
        [turn] = http.get(f"/api/probes/sessions/{name}/transcript").json()["data"]
        assert (turn["turn"], turn["user"], turn["reply"]) == (1, "Name a colour.", reply)
        timeline = http.get(f"/api/probes/sessions/{name}").json()
        assert reply not in str(timeline) and "Name a colour." not in str(timeline)  # text on one route only
        completion = http.post("/v1/completions", json={"model": model_id, "prompt": "Hi", "max_tokens": 2})
        assert completion.headers["x-millm-transcript"] == "off"  # not a chat turn


def test_the_background_pass_keeps_at_most_the_newest_turns(recording):
    name = f"cap-{uuid.uuid4().hex}"
    model_id = recording.model_id
    with recording.http() as http:
        converse(http, model_id, [{"role": "user", "content": "one"}], headers={"X-miLLM-Session": name})
        converse(http, model_id, [{"role": "user", "content": "two"}], headers={"X-miLLM-Session": name})
        deadline = time.monotonic() + 30
        kept = None
        while time.monotonic() < deadline:
            kept = http.get(f"/api/probes/sessions/{name}/transcript").json()["data"]
            if [t["turn"] for t in kept] == [2]:
                break
            time.sleep(0.1)
        assert kept is not None and [(t["turn"], t["user"]) for t in kept] == [(2, "two")]
        assert http.get(f"/api/probes/sessions/{name}").json()["turns"] == 2  # the verdicts stay


def test_retention_removes_expired_text_and_context(recording):
    from millm_probes.sessions.retention import sweep

    name = f"exp-{uuid.uuid4().hex}"
    with recording.http() as http:
        results = converse(
            http, recording.model_id, [{"role": "user", "content": "old"}], headers={"X-miLLM-Session": name}
        ).json()["millm_probe_verdicts"]
        assert http.get(f"/api/probes/events/{results[0]['result_id']}").json()["detail"] is not None  # it fired
        done = sweep(
            recording.host.db,
            {"PROBE_TRANSCRIPT_MAX_AGE_DAYS": 0, "PROBE_TRANSCRIPT_MAX_TURNS": 100, "PROBE_EVENT_MAX_AGE_DAYS": 0},
        )
        assert done["contexts_expired"] >= 1
        assert http.get(f"/api/probes/events/{results[0]['result_id']}").json()["detail"] is None
        assert http.get(f"/api/probes/sessions/{name}/transcript").json()["data"] == []
        sweep(
            recording.host.db,
            {"PROBE_TRANSCRIPT_MAX_AGE_DAYS": 0, "PROBE_TRANSCRIPT_MAX_TURNS": 100, "PROBE_EVENT_MAX_AGE_DAYS": 1e-9},
        )
        assert http.get(f"/api/probes/sessions/{name}").status_code == 404  # expired sessions and verdicts go
        assert http.get(f"/api/probes/events/{results[0]['result_id']}").status_code == 404


def test_an_idle_session_ends_and_its_continuation_opens_a_linked_one(recording):
    with recording.http() as http:
        messages = [{"role": "user", "content": f"idle {uuid.uuid4().hex}"}]
        first = converse(http, recording.model_id, messages)
        messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "still there?"}]
        time.sleep(0.01)  # past PROBE_SESSION_IDLE_MINUTES (0.6 ms)
        second = converse(http, recording.model_id, messages).headers["x-millm-session-id"]
        assert second != first.headers["x-millm-session-id"]
        session = http.get(f"/api/probes/sessions/{second}").json()
        assert session["previous_session_id"] == first.headers["x-millm-session-id"]
        assert http.get(f"/api/probes/sessions/{first.headers['x-millm-session-id']}").json()["ended"] is True


def test_the_default_retention_is_finite(recording):
    settings = recording.host.settings
    assert 0 < settings["PROBE_EVENT_MAX_AGE_DAYS"] < float("inf")  # verdicts and sessions are not kept for ever


def test_a_judge_call_joins_no_session_and_keeps_no_text(recording):
    name = f"judge-{uuid.uuid4().hex}"
    text = f"grade this answer {uuid.uuid4().hex}"
    with recording.http() as http:
        response = converse(
            http,
            recording.model_id,
            [{"role": "user", "content": text}],
            headers={"X-miLLM-Session": name, "X-miLLM-Origin": "judge"},
        )
        assert response.headers["x-millm-transcript"] == "off" and "x-millm-session-id" not in response.headers
        results = response.json()["millm_probe_verdicts"]
        assert {(r["outcome"], r["reason"]) for r in results} == {("skipped", "judge_traffic")}
        assert http.get(f"/api/probes/sessions/{name}").status_code == 404
        for result in results:
            assert http.get(f"/api/probes/events/{result['result_id']}").json()["detail"] is None
        # its continuation is no continuation of anything: the judge's turn left no conversation behind
        follow = [{"role": "user", "content": text}, response.json()["choices"][0]["message"]]
        after = converse(http, recording.model_id, [*follow, {"role": "user", "content": "and?"}])
        assert http.get(f"/api/probes/sessions/{after.headers['x-millm-session-id']}").json()["source"] == "new"


@pytest.mark.parametrize(
    "text",
    ["nul \x00 inside", "\x00", "a lone surrogate \ud800 here", '\x1bjson:"looks stored"'],
    ids=["nul", "only-nul", "surrogate", "marker"],
)
def test_text_a_database_refuses_is_kept_losslessly(recording, text):
    """NUL (PostgreSQL's text refuses it): the turn is stored and its transcript reads back exactly what was
    sent. A lone surrogate (no driver encodes it) is refused with a 400 before generation: no turn at all."""
    name = f"nul-{uuid.uuid4().hex}"
    body = {
        "model": recording.model_id,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "temperature": 0,
    }
    with recording.http() as http:
        response = http.post(
            "/v1/chat/completions",
            content=json.dumps(body).encode(),  # ASCII JSON: a lone surrogate travels as its escape
            headers={"Content-Type": "application/json", "X-miLLM-Session": name},
        )
        if "\ud800" in text:
            assert response.status_code == 400 and response.json()["error"]["param"] == "messages[0].content"
            assert http.get(f"/api/probes/sessions/{name}").status_code == 404
            return
        assert response.status_code == 200, response.text
        assert response.headers["x-millm-transcript"] == "recorded"
        reply = response.json()["choices"][0]["message"]["content"]
        [turn] = http.get(f"/api/probes/sessions/{name}/transcript").json()["data"]
        assert (turn["turn"], turn["user"], turn["reply"]) == (1, text, reply)
        assert http.get(f"/api/probes/sessions/{name}").json()["turns"] == 1
        fired = [r for r in response.json()["millm_probe_verdicts"] if r["fires"]]
        assert fired and http.get(f"/api/probes/events/{fired[0]['result_id']}").json()["detail"] is not None
