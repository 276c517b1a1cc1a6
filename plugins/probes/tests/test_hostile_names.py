"""Probe and behaviour names of any text reach X-miLLM-Probe-Verdicts losslessly, never a 500.

An RFC 8941 String holds printable ASCII only: every name is percent-encoded
(issue 11 §3). Names here are the hostile ones an import accepts: non-ASCII,
quotes, backslashes, percent signs, the 200-character maximum in 4-byte letters.
"""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from millm_host.headers import parse_list

CHAT = [{"role": "user", "content": "Say something."}]
NAMES = [
    ("détecteur", "comportement à risque"),
    ('q"uote\\back%25slash', "日本語の振る舞い"),
    ("😀" * 200, "🚨" * 200),
]


@pytest.mark.parametrize(("name", "behaviour"), NAMES, ids=["accents", "quotes", "astral-200"])
def test_hostile_probe_and_behaviour_names_reach_the_header(api, lab, identity, helpers, model_id, name, behaviour):
    doc = lab.definition(identity, name=name, behaviour=behaviour, windows=["all"])
    probe = helpers.import_probe(api, doc)
    helpers.arm(api, probe["id"])
    response = api.post("/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 3})
    assert response.status_code == 200, response.text
    (member,) = [m for m in parse_list(response.headers["x-millm-probe-verdicts"]) if m.value != "..."]
    assert unquote(member.value) == name
    assert unquote(member.params["behaviour"]) == behaviour
    assert member.params["probe"] == probe["id"]
    (result,) = response.json()["millm_probe_verdicts"]
    assert result["name"] == name and result["behaviour"] == behaviour  # the body carries them as they are


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ('{"inputs": [{"text": "a\\ud800"}]}', "inputs[0].text"),
        (
            '{"inputs": [{"text": "fine"}, {"messages": [{"role": "user", "content": "\\udc00"}]}]}',
            "inputs[1].messages[0].content",
        ),
        ('{"inputs": [{"messages": [{"role": "assistant", "content": "Hi"}]}]}', "inputs[0].messages"),
    ],
    ids=["surrogate-text", "surrogate-message", "assistant-only"],
)
def test_score_refuses_what_no_model_can_take(api, raw, param):
    """Each was a 500 (TypeError from the tokenizer, ValueError from the chat template)."""
    response = api.post("/api/probes/score", content=raw.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["param"] == param


def test_a_long_version_and_provenance_id_are_stored_as_given(api, lab, identity, helpers):
    """Neither has a length limit: PostgreSQL, which enforces VARCHAR lengths, stores them too (a 500 before)."""
    doc = lab.definition(identity, name="long-version")
    doc["version"] = "v" * 300
    doc["provenance"]["probe_id"] = "p" * 300
    probe = helpers.import_probe(api, doc)
    assert api.get(f"/api/probes/{probe['id']}").json()["version"] == "v" * 300
