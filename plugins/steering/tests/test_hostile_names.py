"""Hostile names on every steering surface: carried losslessly in X-miLLM-Steering, refused with a 4xx, never a 500.

Profile names reach the header's ``name`` parameter percent-encoded (issue 11 §3);
SAE ids are refused at registration unless they are plain, so a hostile one never
reaches a header, and every route that takes one answers 4xx.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

import pytest

from millm_host.headers import parse_list

PROFILE_NAMES = ["détecteur", 'q"uote\\back%25slash', "日本語 😀", "😀" * 200]
HOSTILE_SAE_IDS = ["détecteur", 'q"uote', "back\\slash", "pct%25", "a" * 1024, "😀", "x\u202ey", "tab\tbed"]


def steering(response):
    assert response.status_code == 200, response.text
    [member] = list(parse_list(response.headers["x-millm-steering"]))
    return str(member.value), dict(member.params)


def assert_4xx(response):
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    assert set(response.json()["error"]) >= {"message", "type", "param", "code"}


@pytest.mark.parametrize("name", PROFILE_NAMES, ids=["accents", "quotes", "cjk-emoji", "astral-200"])
def test_profile_names_reach_the_header_losslessly(client, attach, model_id, name):
    attach("sae-a")
    created = client.post(
        "/api/profiles", json={"name": name, "sae_id": "sae-a", "features": [{"index": 3, "strength": 2.0}]}
    )
    assert created.status_code == 200, created.text
    path = f"/api/profiles/{quote(name, safe='')}"
    try:
        body = {"model": model_id, "max_tokens": 2, "messages": [{"role": "user", "content": "Hello"}]}
        kind, params = steering(client.post("/v1/chat/completions", json={**body, "profile": name}))
        assert (kind, str(params["source"]), unquote(params["name"])) == ("profile", "request", name)

        assert client.get(path).json()["name"] == name
        client.post(f"{path}/activate").raise_for_status()
        kind, params = steering(
            client.post("/v1/completions", json={"model": model_id, "max_tokens": 2, "prompt": "Hi"})
        )
        assert (kind, str(params["source"]), unquote(params["name"])) == ("profile", "active", name)
        [member] = list(parse_list(client.get("/api/steering").json()["applied"]))
        assert unquote(member.params["name"]) == name
    finally:
        client.post("/api/profiles/deactivate")
        client.delete(path)


@pytest.mark.parametrize("sae_id", HOSTILE_SAE_IDS, ids=range(len(HOSTILE_SAE_IDS)))
def test_hostile_sae_ids_are_refused_not_500(client, sae_dir, model_id, sae_id):
    path = sae_dir("plain-sae")
    assert_4xx(client.post("/api/saes", json={"path": str(path), "sae_id": sae_id}))
    quoted = quote(sae_id, safe="")
    assert_4xx(client.get(f"/api/saes/{quoted}"))
    assert_4xx(client.post(f"/api/saes/{quoted}/attach", json={}))
    assert_4xx(client.put("/api/steering", json={"sae_id": sae_id, "features": [{"index": 1, "strength": 1.0}]}))
    assert_4xx(
        client.post("/api/profiles", json={"name": "p", "sae_id": sae_id, "features": [{"index": 1, "strength": 1.0}]})
    )
    body = {
        "model": model_id,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "Hello"}],
        "steering": {"sae_id": sae_id, "features": [{"index": 1, "strength": 1.0}]},
    }
    assert_4xx(client.post("/v1/chat/completions", json=body))
    assert client.get("/api/saes").json()["data"] == []


def test_a_directory_with_a_hostile_name_is_refused_not_500(client, sae_dir):
    path = sae_dir('dé"tec\\teur 😀')
    assert_4xx(client.post("/api/saes", json={"path": str(path)}))


def test_a_profile_name_that_is_a_lone_surrogate_is_a_400(client, attach, model_id):
    """A ``\\ud800`` escape decodes to text no database or header can hold (it was a UnicodeEncodeError, a 500)."""
    attach("sae-a")
    headers = {"content-type": "application/json"}
    create = '{"name": "\\ud800", "sae_id": "sae-a", "features": [{"index": 1, "strength": 1.0}]}'
    response = client.post("/api/profiles", content=create.encode(), headers=headers)
    assert_4xx(response)
    assert (response.status_code, response.json()["error"]["param"]) == (400, "name")
    inline = (
        f'{{"model": "{model_id}", "max_tokens": 1, "messages": [{{"role": "user", "content": "Hi"}}], '
        '"profile": "x\\udfff"}'
    )
    response = client.post("/v1/chat/completions", content=inline.encode(), headers=headers)
    assert (response.status_code, response.json()["error"]["param"]) == (400, "profile")
    assert client.get("/api/profiles").json()["data"] == []
