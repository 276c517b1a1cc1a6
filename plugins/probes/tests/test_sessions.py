"""Sessions: the X-miLLM-Session header, continuation by conversation prefix, timelines and deletion."""

from __future__ import annotations

import uuid

import pytest

from millm_host.testing import assert_error, chat as post_chat


@pytest.fixture(scope="module")
def armed(probes_server, lab, identity, helpers):
    """Two armed probes: one of a behaviour that always fires, one of no behaviour that never does."""
    docs = [
        lab.definition(identity, name="sess-fires", behaviour="sess-stakes", threshold=-1e9, seed=4),
        lab.definition(identity, name="sess-quiet", threshold=1e9, seed=5),
    ]
    with probes_server.http() as http, helpers.armed(http, docs) as ids:
        yield ids


def converse(http, model_id, messages, headers=None, **extra):
    response = post_chat(http, model_id, headers=headers, messages=messages, max_tokens=4, temperature=0, **extra)
    assert response.status_code == 200, response.text
    return response


def opening() -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Hello there, conversation {uuid.uuid4().hex}"}]


def test_nothing_armed_means_no_session(probes_server, model_id):
    """First in this module: its probes are armed from the next test on."""
    with probes_server.http() as http:
        response = converse(http, model_id, opening(), headers={"X-miLLM-Session": "unarmed"})
    assert "x-millm-session-id" not in response.headers and "x-millm-transcript" not in response.headers


def test_a_named_session_is_stored_as_given_with_a_turn_per_request(probes_server, armed, model_id):
    name = f"chat {uuid.uuid4().hex}: {{x}}"
    with probes_server.http() as http:
        first = converse(http, model_id, opening(), headers={"X-miLLM-Session": name})
        assert first.headers["x-millm-session-id"] == name
        assert first.headers["x-millm-transcript"] == "off"
        converse(http, model_id, opening(), headers={"X-miLLM-Session": name})
        timeline = http.get(f"/api/probes/sessions/{name}").json()
    assert timeline["id"] == name and timeline["source"] == "header" and timeline["turns"] == 2
    assert [row["turn"] for row in timeline["timeline"]] == [1, 2]
    # in the results' order: behaviour by behaviour (a probe with no behaviour is its own column)
    assert timeline["columns"] == [
        {"key": "sess-quiet", "kind": "probe", "rules": []},
        {"key": "sess-stakes", "kind": "behaviour", "rules": []},
    ]
    row = timeline["timeline"][1]
    assert row["cells"]["sess-stakes"][0]["fires"] is True and row["cells"]["sess-quiet"][0]["fires"] is False
    results = first.json()["millm_probe_verdicts"]
    assert [r["result_id"] for r in timeline["timeline"][0]["cells"]["sess-stakes"]] == [results[1]["result_id"]]
    assert timeline["fired"] == 2


@pytest.mark.parametrize("value", ["", "x" * 129, "caf\u00e9"])
def test_an_invalid_session_name_is_refused(probes_server, model_id, value):
    with probes_server.http() as http:
        response = post_chat(
            http,
            model_id,
            headers={"X-miLLM-Session": value.encode("latin-1")},
            messages=opening(),
            max_tokens=1,
        )
    assert_error(response, 400, "SESSION_ID_INVALID", param="X-miLLM-Session")


def test_open_webui_chat_id_header_makes_each_chat_one_session(probes_server, armed, model_id):
    """Open WebUI sends the custom header X-miLLM-Session: {{CHAT_ID}}, one UUID per chat."""
    chat_id = str(uuid.uuid4())
    with probes_server.http() as http:
        messages = opening()
        reply = converse(http, model_id, messages, headers={"X-miLLM-Session": chat_id}).json()
        messages += [reply["choices"][0]["message"], {"role": "user", "content": "and then?"}]
        assert (
            converse(http, model_id, messages, headers={"X-miLLM-Session": chat_id}).headers["x-millm-session-id"]
            == chat_id
        )
        assert http.get(f"/api/probes/sessions/{chat_id}").json()["turns"] == 2


def test_a_resent_conversation_joins_the_session_it_continues(probes_server, armed, model_id):
    with probes_server.http() as http:
        messages = opening()
        first = converse(http, model_id, messages)
        session_id = first.headers["x-millm-session-id"]
        assert session_id.startswith("ses_")
        messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "Go on."}]
        second = converse(http, model_id, messages)
        assert second.headers["x-millm-session-id"] == session_id
        # a client that rewrote the earlier reply still joins: exactly one conversation matches
        rewritten = [*messages[:1], {"role": "assistant", "content": "something else"}, messages[2]]
        assert converse(http, model_id, rewritten).headers["x-millm-session-id"] == session_id
        # a new conversation opens a new session
        assert converse(http, model_id, opening()).headers["x-millm-session-id"] != session_id
        timeline = http.get(f"/api/probes/sessions/{session_id}").json()
    assert timeline["turns"] == 3 and timeline["ambiguous"] is False


def test_two_matching_conversations_open_an_ambiguous_session(probes_server, armed, model_id):
    with probes_server.http() as http:
        messages = opening()
        one = converse(http, model_id, messages)
        two = converse(http, model_id, messages)  # greedy: the same conversation twice
        ids = {one.headers["x-millm-session-id"], two.headers["x-millm-session-id"]}
        assert len(ids) == 2
        messages += [one.json()["choices"][0]["message"], {"role": "user", "content": "Go on."}]
        third = converse(http, model_id, messages).headers["x-millm-session-id"]
        assert third not in ids
        session = http.get(f"/api/probes/sessions/{third}").json()
        assert session["ambiguous"] is True
        listed = http.get("/api/probes/sessions", params={"ambiguous": "true", "limit": 500}).json()["data"]
        assert third in [s["id"] for s in listed] and all(s["ambiguous"] for s in listed)


def test_streams_and_completions_say_their_session(probes_server, armed, model_id):
    name = f"stream-{uuid.uuid4().hex}"
    with probes_server.http() as http:
        with http.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": model_id, "messages": opening(), "max_tokens": 3, "stream": True},
            headers={"X-miLLM-Session": name},
        ) as stream:
            assert stream.headers["x-millm-session-id"] == name
            assert stream.headers["x-millm-transcript"] == "off"
            stream.read()
        completion = http.post(
            "/v1/completions",
            json={"model": model_id, "prompt": "Once upon a time", "max_tokens": 3},
            headers={"X-miLLM-Session": name},
        )
        assert completion.status_code == 200 and completion.headers["x-millm-session-id"] == name
        timeline = http.get(f"/api/probes/sessions/{name}").json()
    assert [row["endpoint"] for row in timeline["timeline"]] == ["chat.completions", "completions"]


def test_deleting_a_session_keeps_its_verdicts_detached_or_deletes_them(probes_server, armed, model_id):
    with probes_server.http() as http:
        kept, dropped = f"keep-{uuid.uuid4().hex}", f"drop-{uuid.uuid4().hex}"
        kept_ids = [
            r["result_id"]
            for r in converse(http, model_id, opening(), headers={"X-miLLM-Session": kept}).json()[
                "millm_probe_verdicts"
            ]
        ]
        dropped_ids = [
            r["result_id"]
            for r in converse(http, model_id, opening(), headers={"X-miLLM-Session": dropped}).json()[
                "millm_probe_verdicts"
            ]
        ]
        assert http.delete(f"/api/probes/sessions/{kept}", params={"events": "keep"}).status_code == 200
        assert http.delete(f"/api/probes/sessions/{dropped}", params={"events": "delete"}).status_code == 200
        assert http.get(f"/api/probes/sessions/{kept}").status_code == 404
        for result_id in kept_ids:
            event = http.get(f"/api/probes/events/{result_id}").json()
            assert event["result_id"] == result_id and event["detail"] is None  # detached, its text gone
        for result_id in dropped_ids:
            assert http.get(f"/api/probes/events/{result_id}").status_code == 404
        assert_error(http.delete(f"/api/probes/sessions/{kept}"), 404, "session_not_found")
        assert_error(
            http.delete("/api/probes/sessions/x", params={"events": "maybe"}), 400, "invalid_parameter", "events"
        )


def test_session_list_pages_and_filters(probes_server, armed, model_id):
    with probes_server.http() as http:
        for _ in range(3):
            converse(http, model_id, opening())
        first = http.get("/api/probes/sessions", params={"limit": 2}).json()
        assert len(first["data"]) == 2 and first["has_more"] is True
        second = http.get("/api/probes/sessions", params={"limit": 2, "after": first["last_id"]}).json()
        assert not {s["id"] for s in first["data"]} & {s["id"] for s in second["data"]}
        fired = http.get("/api/probes/sessions", params={"fired": "true", "limit": 500}).json()["data"]
        assert fired and all(s["fired"] > 0 for s in fired)
        assert http.get("/api/probes/sessions", params={"source": "header", "limit": 500}).json()["data"]
        assert_error(http.get("/api/probes/sessions", params={"limit": "0"}), 400, "invalid_parameter", "limit")
        assert_error(http.get("/api/probes/sessions", params={"after": "nope"}), 404, "session_not_found")
        assert_error(http.get("/api/probes/sessions/nope/transcript"), 404, "session_not_found")


@pytest.fixture(scope="module")
def ungrouped(app_factory, probe_model_dir, identity, lab, helpers):
    """An app with sessions off (PROBE_SESSIONS=false) and one armed probe."""
    app = app_factory(plugins="all", checkpoint=probe_model_dir, env={"PROBE_SESSIONS": "false"})
    with app.http() as http:
        probe = helpers.import_probe(http, lab.definition(identity, name="ungrouped", threshold=-1e9, seed=9))
        helpers.arm(http, probe["id"])
    return app


def test_sessions_off_monitors_without_grouping(ungrouped):
    model_id = ungrouped.model_id
    with ungrouped.http() as http:
        messages = opening()
        first = converse(http, model_id, messages, headers={"X-miLLM-Session": "named"})
        assert "x-millm-probe-verdicts" in first.headers  # still monitored
        assert "x-millm-session-id" not in first.headers and first.headers["x-millm-transcript"] == "off"
        messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "Go on."}]
        assert "x-millm-session-id" not in converse(http, model_id, messages).headers
        assert http.get("/api/probes/sessions").json()["data"] == []
        event = http.get("/api/probes/events", params={"limit": 1}).json()["data"][0]
        assert event.get("session_id") is None and event.get("turn") is None
        assert_error(
            post_chat(http, model_id, headers={"X-miLLM-Session": ""}, messages=messages, max_tokens=1),
            400,
            "SESSION_ID_INVALID",
        )
