"""Hostile input never takes the server down or answers 500 (issue 11 §0, §3, §3b).

- One body, parsed slowly, must not freeze the event loop: ``/api/health`` answers
  while a 4 MiB pathological body is refused.
- Every string that reaches a structured header is percent-encoded, losslessly.
- Input the model cannot take (lone surrogates, an assistant-only chat, an empty
  prompt) is a 400 in OpenAI's shape.
"""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from millm_host.headers import Token, item, parse_list, percent_encode, serialize_item, serialize_list

from .helpers import chat_body

HOSTILE = ['q"uote', "back\\slash", "100%", "détecteur", "日本語", "😀", "tab\tnew\nline\x00\x7f", "bidi\u202eover",
           "zero\u200bwidth", "x" * 1024, "é" * 1024]


# --- §3: structured headers carry any string ------------------------------------------

@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_every_header_string_is_percent_encoded_losslessly(text):
    value = serialize_list([item(text, {"name": text, "kind": Token("probe"), "n": 3, "flag": True})])
    value.encode("ascii")  # printable ASCII, or a response could not carry it
    [member] = list(parse_list(value))
    assert unquote(member.value) == text and unquote(member.params["name"]) == text
    assert str(member.params["kind"]) == "probe" and member.params["n"] == 3 and member.params["flag"] is True


def test_percent_encoding_is_the_spec_s():
    assert percent_encode("plain name-1") == "plain name-1"
    assert percent_encode('a"b\\c%d\n') == "a%22b%5Cc%25d%0A"
    assert percent_encode("日") == "%E6%97%A5"
    assert percent_encode("a\ud800") == "a%ED%A0%80"  # a lone surrogate never raises
    assert serialize_item(Token("json_schema"), {"name": "x"}) == 'json_schema;name="x"'


def test_ignored_field_names_are_carried_losslessly(tiny_server):
    names = ['a"b', "c\\d", "e%41f", "日本"]
    with tiny_server.http() as http:
        body = chat_body(tiny_server.model_id, max_tokens=1, **{name: 1 for name in names})
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert [unquote(m.value) for m in parse_list(response.headers["x-millm-ignored-fields"])] == names
