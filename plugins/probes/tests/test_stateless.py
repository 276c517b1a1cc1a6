"""``POST /api/probes/score``: every rule of "Scoring stored text"."""

from __future__ import annotations

import pytest

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def probe_doc(probes_server, lab, identity, helpers):
    """One imported (never armed) probe reading every window."""
    doc = lab.definition(identity, name="offline", rule="mean", windows=["all", "prompt", "response", "last_user"])
    with probes_server.http() as http:
        probe = helpers.import_probe(http, doc)
        yield probe["id"], doc
        http.delete(f"/api/probes/{probe['id']}")


def score(api, body, status=200):
    response = api.post("/api/probes/score", json=body)
    assert response.status_code == status, response.text
    return response.json()


def windows_of(output):
    return {r["window"]: r for r in output["results"]}


def test_nothing_is_persisted_and_nothing_armed(api, probe_doc):
    probe_id, _ = probe_doc
    events = api.get("/api/probes/events", params={"limit": 1}).json()["data"]
    reports = api.get(f"/api/probes/{probe_id}/parity").json()["data"]
    result = score(api, {"probe_ids": [probe_id], "inputs": [{"text": "Hello there"}]})
    assert all(
        r["persistence"] == "not_persisted" and r["execution_mode"] == "stateless"
        for r in result["results"][0]["results"]
    )
    assert api.get("/api/probes/events", params={"limit": 1}).json()["data"] == events
    assert api.get(f"/api/probes/{probe_id}/parity").json()["data"] == reports
    assert api.get("/api/probes/status").json()["armed"] == []
    [probe] = result["probes"]
    assert probe["parity"]["status"] == "never_run"


def test_text_is_one_user_turn(api, lab, probe_doc):
    probe_id, doc = probe_doc
    result = score(
        api,
        {
            "probe_ids": [probe_id],
            "inputs": [{"text": "Is this safe?"}, {"messages": [{"role": "user", "content": "Is this safe?"}]}],
        },
    )
    as_text, as_messages = result["results"]
    assert as_text["results"][0]["score"] == as_messages["results"][0]["score"]
    ids = lab.chat_ids([{"role": "user", "content": "Is this safe?"}])
    assert as_text["n_tokens"] == len(ids) and as_text["prompt_tokens"] == len(ids)
    assert abs(as_text["results"][0]["score"] - lab.score(doc, ids)) <= TOLERANCE


def test_boundaries_are_never_guessed(api, lab, probe_doc):
    probe_id, doc = probe_doc
    conversation = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue, mostly."}]
    ids = lab.chat_ids(conversation[:1]) + lab.tokenizer("Blue, mostly.", add_special_tokens=False)["input_ids"]
    prompt_len = len(lab.chat_ids(conversation[:1]))
    result = score(
        api,
        {
            "probe_ids": [probe_id],
            "inputs": [
                {"messages": conversation},  # ends in an assistant turn: the boundary is derived
                {"token_ids": ids},  # bare ids: no boundary, no turns
                {"token_ids": ids, "prompt_tokens": -1},
                {"token_ids": ids, "prompt_tokens": len(ids) + 1},
                {"messages": conversation, "prompt_tokens": prompt_len - 1},
                {"messages": conversation, "prompt_tokens": prompt_len},
            ],
        },
    )
    derived, bare, negative, beyond, conflict, agreeing = result["results"]
    assert derived["n_tokens"] == len(ids) and derived["prompt_tokens"] == prompt_len
    windows = windows_of(derived)
    assert abs(windows["response"]["score"] - lab.score(doc, ids, prompt_len, len(ids))) <= TOLERANCE
    user_start, user_end = lab.last_user_span(ids)
    assert abs(windows["last_user"]["score"] - lab.score(doc, ids, user_start, user_end)) <= TOLERANCE
    bare = windows_of(bare)
    assert bare["all"]["outcome"] == "completed"
    assert (bare["prompt"]["outcome"], bare["prompt"]["reason"]) == ("skipped", "prompt_boundary_unknown")
    assert bare["response"]["reason"] == "prompt_boundary_unknown"
    assert bare["last_user"]["reason"] == "token_ids_have_no_turns"
    for failed in (negative, beyond):
        assert (windows_of(failed)["prompt"]["outcome"], windows_of(failed)["prompt"]["reason"]) == (
            "failed",
            "prompt_boundary_invalid",
        )
    assert windows_of(conflict)["response"]["reason"] == "prompt_boundary_conflict"
    assert windows_of(agreeing)["response"]["outcome"] == "completed"


def test_a_conversation_without_a_user_turn(api, probe_doc):
    probe_id, _ = probe_doc
    result = score(
        api,
        {
            "probe_ids": [probe_id],
            "windows": ["last_user", "all"],
            "inputs": [{"messages": [{"role": "system", "content": "Only a system prompt."}]}],
        },
    )
    windows = windows_of(result["results"][0])
    assert (windows["last_user"]["outcome"], windows["last_user"]["reason"]) == ("skipped", "no_user_turn")
    assert windows["all"]["outcome"] == "completed"


def test_windows_may_be_chosen(api, probe_doc):
    probe_id, _ = probe_doc
    result = score(api, {"probe_ids": [probe_id], "windows": ["prompt"], "inputs": [{"text": "hi"}]})
    assert [r["window"] for r in result["results"][0]["results"]] == ["prompt"]


def test_refusals(api, probe_doc, identity):
    probe_id, _ = probe_doc

    def refused(body, status, param=None, code=None):
        error = score(api, body, status)["error"]
        if param is not None:
            assert error["param"] == param, error
        if code is not None:
            assert error["code"] == code, error

    assert "/api/probes/score" in api.get("/openapi.json").json()["paths"]
    refused({"probe_ids": [probe_id], "inputs": []}, 400, "inputs")
    refused({"probe_ids": [probe_id], "inputs": [{"text": "a"}] * 65}, 400, "inputs", "PROBE_SCORE_MAX_INPUTS")
    refused({"probe_ids": [probe_id], "inputs": [{"token_ids": [1, 2], "text": "a"}]}, 400)
    refused({"probe_ids": [probe_id], "inputs": [{"text": "a", "prompt_tokens": 1}]}, 400)
    refused({"probe_ids": [probe_id], "inputs": [{"token_ids": [1, 10**7]}]}, 400, "inputs[0].token_ids")
    refused(
        {"probe_ids": [probe_id], "inputs": [{"token_ids": [1] * 5000}]}, 400, "inputs[0]", "context_length_exceeded"
    )
    refused({"probe_ids": [probe_id], "inputs": [{"text": "a"}], "steering": {}}, 400, "steering")
    refused({"probe_ids": [probe_id], "inputs": [{"text": "a"}], "windows": ["middle"]}, 400, "windows[0]")
    refused({"probe_ids": ["pr_000000000000"], "inputs": [{"text": "a"}]}, 404, "probe_ids[0]")
    refused({"probe_ids": [probe_id] * 2, "inputs": [{"text": "a"}]}, 400)
    refused({"probe_ids": [f"pr_{i:012x}" for i in range(65)], "inputs": [{"text": "a"}]}, 400, "probe_ids")


def test_wrong_model_refuses_named_probes_and_skips_the_rest(api, lab, identity, helpers, probe_doc):
    probe_id, _ = probe_doc
    other = helpers.import_probe(
        api, lab.definition(dict(identity, hf_id="someone/else", d_model=identity["d_model"]), name="elsewhere")
    )
    error = score(api, {"probe_ids": [probe_id, other["id"]], "inputs": [{"text": "a"}]}, 409)["error"]
    assert error["code"] == "PROBE_MODEL_MISMATCH" and error["gate"] == "identity"
    [refused] = error["probes"]
    assert refused["probe_id"] == other["id"]
    assert refused["mismatches"] == [{"field": "model.hf_id", "probe": "someone/else", "model": identity["hf_id"]}]
    everything = score(api, {"inputs": [{"text": "a"}]})
    assert other["id"] in {s["probe_id"] for s in everything["skipped"]}
    assert probe_id in {r["probe_id"] for r in everything["results"][0]["results"]}
    assert other["id"] not in {r["probe_id"] for r in everything["results"][0]["results"]}


def test_a_non_finite_score_is_not_reported(api, lab, identity, helpers):
    doc = lab.definition(identity, name="overflowing", digests=False, vectors=0)
    doc["head"]["weights"] = [1e300] * identity["d_model"]
    probe = helpers.import_probe(api, doc)
    [result] = score(api, {"probe_ids": [probe["id"]], "inputs": [{"text": "a"}]})["results"][0]["results"]
    assert (result["outcome"], result["reason"], result["score"]) == ("failed", "non_finite_score", None)


def test_parity_state_is_reported(api, lab, identity, helpers):
    probe = helpers.import_probe(api, lab.definition(identity, name="checked"))
    api.post(f"/api/probes/{probe['id']}/parity")
    [state] = score(api, {"probe_ids": [probe["id"]], "inputs": [{"text": "a"}]})["probes"]
    assert state["parity"]["status"] == "passed" and state["parity"]["model_load_id"] == identity["load_id"]


@pytest.mark.parametrize("kind", ["text", "messages"])
def test_text_that_cannot_fit_is_refused_before_it_is_tokenized(api, probe_doc, kind):
    """From the rendered text's length alone (``Engine.min_tokens``), as chat and completions refuse it:
    tokenizing 4 MiB took seconds. The message says it is a lower bound."""
    probe_id, _ = probe_doc
    text = "a " * 200_000
    item = {"text": text} if kind == "text" else {"messages": [{"role": "user", "content": text}]}
    error = score(api, {"probe_ids": [probe_id], "inputs": [{"text": "a"}, item]}, 400)["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "inputs[1]", error
    assert "at least" in error["message"], error
