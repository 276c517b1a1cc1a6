"""response_format through a real server on tiny models: constraint, validation, header, refusals."""

from __future__ import annotations

import json

import http_sfv
import jsonschema
import pytest

from millm_host.testing import assert_error, chat_body, sse_events

from .family import scripted

MODEL = "tiny-qwen25"
JUDGE = {
    "type": "object",
    "properties": {"label": {"enum": ["humor", "not_humor"]}, "sure": {"type": "boolean"}},
    "required": ["label", "sure"],
    "additionalProperties": False,
}
JUDGE_FORMAT = {"type": "json_schema", "json_schema": {"name": "judge_v1", "strict": True, "schema": JUDGE}}


def judge_body(**extra):
    return chat_body(MODEL, "Is this funny?", **{"max_tokens": 40, **extra})


@pytest.fixture(scope="module")
def http(family_server):
    with family_server.http() as client:
        yield client


def constrained_header(response) -> http_sfv.Item:
    item = http_sfv.Item()
    item.parse(response.headers["x-millm-constrained"].encode())
    return item


def test_json_schema_output_validates_with_header(http):
    response = http.post("/v1/chat/completions", json=judge_body(response_format=JUDGE_FORMAT, temperature=1.0, seed=3))
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), JUDGE)
    item = constrained_header(response)
    assert item.value == http_sfv.Token("json_schema") and item.params["name"] == "judge_v1"


def test_strict_false_is_still_enforced(http):
    loose = {"type": "json_schema", "json_schema": {"name": "judge_v1", "strict": False, "schema": JUDGE}}
    for seed in range(3):
        response = http.post("/v1/chat/completions", json=judge_body(response_format=loose, temperature=1.0, seed=seed))
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), JUDGE)


def test_json_object(http):
    response = http.post(
        "/v1/chat/completions", json=judge_body(response_format={"type": "json_object"}, max_tokens=60, seed=1)
    )
    assert response.status_code == 200, response.text
    assert constrained_header(response).value == http_sfv.Token("json_object")
    choice = response.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:
        assert choice["finish_reason"] == "length" and choice["message"]["content"].startswith("{")


def test_max_tokens_cut_is_length_not_validated(http):
    response = http.post("/v1/chat/completions", json=judge_body(response_format=JUDGE_FORMAT, max_tokens=3))
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert '{"label": "'.startswith(choice["message"]["content"]) or choice["message"]["content"].startswith('{"')


def test_every_choice_and_row_is_constrained(http):
    body = judge_body(
        response_format=JUDGE_FORMAT,
        n=3,
        temperature=1.0,
        seed=11,
        extra_messages=[[{"role": "user", "content": "And this one?"}]],
    )
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert len(choices) == 6
    for choice in choices:
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), JUDGE)


def test_complete_document_failing_validation_is_500(http):
    # The scripted reply overrides the constraint (its processor runs last) and ends the
    # document with a label the schema does not allow: the server must not answer 200.
    bad = '{"label": "other", "sure": true}'
    response = http.post("/v1/chat/completions", json=judge_body(response_format=JUDGE_FORMAT), headers=scripted(bad))
    error = assert_error(response, 500, "constrained_output_invalid")
    assert error["type"] == "server_error"
    assert "label" in error["message"]
    assert http.post("/v1/chat/completions", json=judge_body(response_format=JUDGE_FORMAT)).status_code == 200


def stream_events(http, body, headers=None) -> list:
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}, headers=headers) as response:
        response.read()
        assert response.status_code == 200, response.text
        assert constrained_header(response).value == http_sfv.Token(body["response_format"]["type"])
        return sse_events(response)


def streamed_text(events, index=0) -> str:
    return "".join(
        c["delta"].get("content") or ""
        for e in events
        if isinstance(e, dict)
        for c in e.get("choices", [])
        if c["index"] == index
    )


def verdicts(events) -> list:
    return [e["millm_validation"] for e in events if isinstance(e, dict) and "millm_validation" in e]


@pytest.mark.parametrize("seed", [3, 4])
def test_stream_json_schema_validates_and_says_so(http, seed):
    events = stream_events(http, judge_body(response_format=JUDGE_FORMAT, temperature=1.0, seed=seed))
    assert events[-1] == "[DONE]"
    jsonschema.validate(json.loads(streamed_text(events)), JUDGE)
    assert verdicts(events) == [[{"index": 0, "status": "valid"}]]


def test_stream_json_object(http):
    events = stream_events(http, judge_body(response_format={"type": "json_object"}, max_tokens=60, seed=1))
    text = streamed_text(events)
    [[verdict]] = verdicts(events)
    if verdict["status"] == "valid":
        assert isinstance(json.loads(text), dict)
    else:
        assert verdict == {"index": 0, "status": "incomplete"} and text.startswith("{")


def test_stream_cut_by_max_tokens_is_incomplete(http):
    events = stream_events(http, judge_body(response_format=JUDGE_FORMAT, max_tokens=3))
    assert verdicts(events) == [[{"index": 0, "status": "incomplete"}]]


def test_stream_document_failing_validation_is_reported_in_the_last_chunk(http):
    """The tokens are already sent, so the stream stays 200 and its last chunk says why the document fails."""
    bad = '{"label": "other", "sure": true}'
    events = stream_events(http, judge_body(response_format=JUDGE_FORMAT), headers=scripted(bad))
    assert streamed_text(events) == bad
    [[verdict]] = verdicts(events)
    assert verdict["index"] == 0 and verdict["status"] == "invalid" and "label" in verdict["message"]
    assert events[-1] == "[DONE]" and not any("error" in e for e in events if isinstance(e, dict))


def resident(http) -> str:
    return http.get("/api/health").json()["model"]


@pytest.mark.parametrize(
    "extra, code, param",
    [
        ({"stop": ["}"]}, "response_format_unsupported", "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "integer", "not": {"const": 3}}},
                }
            },
            "response_format_unsupported",
            "response_format",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a(?=b)"}},
                }
            },
            "response_format_unsupported",
            "response_format",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
                    },
                }
            },
            "response_format_unsupported",
            "response_format",
        ),
    ],
)
def test_refused_before_loading(http, extra, code, param):
    before = resident(http)
    other = "tiny-llama31" if before != "tiny-llama31" else "tiny-lfm2"
    body = {**judge_body(response_format=JUDGE_FORMAT), **extra, "model": other}
    assert_error(http.post("/v1/chat/completions", json=body), 400, code, param)
    assert resident(http) == before  # nothing was loaded for it


def test_unsupported_keywords_are_named_with_pointers(http):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "not": {}}, "s": {"format": "binary"}}}
    body = judge_body(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    error = http.post("/v1/chat/completions", json=body).json()["error"]
    assert "not at /properties/n/not" in error["message"]
    assert "format at /properties/s/format (format 'binary' cannot be enforced" in error["message"]


def test_completions_refuse_response_format(http):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "response_format": {"type": "json_object"}}
    assert_error(http.post("/v1/completions", json=body), 400, "field_not_honoured", "response_format")
    body["response_format"] = {"type": "text"}  # "no change" is accepted everywhere
    assert http.post("/v1/completions", json=body).status_code == 200


def test_text_format_is_plain(http):
    response = http.post("/v1/chat/completions", json=judge_body(response_format={"type": "text"}, max_tokens=4))
    assert response.status_code == 200
    assert "x-millm-constrained" not in response.headers


def test_openai_sdk_parse_helper(family_server):
    """The SDK's parse() helper sends json_schema from a pydantic model and reads the reply back."""
    from typing import Literal

    import pydantic

    class Judge(pydantic.BaseModel):
        label: Literal["humor", "not_humor"]
        sure: bool

    client = family_server.openai()
    completion = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Funny?"}], response_format=Judge, max_tokens=40, seed=5
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Judge)
