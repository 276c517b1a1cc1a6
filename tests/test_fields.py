"""Every field is honoured, reported or refused (X-miLLM-Ignored-Fields, X-miLLM-Strict, field_not_honoured).

In-process, on the echo engine: which fields are honoured is the host's logic.
"""

from __future__ import annotations

import pytest

from millm_host.headers import parse_list
from millm_host.testing import assert_error, chat_body, stream_post


@pytest.fixture(scope="module")
def server(echo_app):
    return echo_app


@pytest.fixture(scope="module")
def model(server) -> str:
    return server.model_id


def _ignored(response) -> list[str]:
    header = response.headers.get("x-millm-ignored-fields")
    return [] if header is None else [item.value for item in parse_list(header)]


def test_unused_fields_are_reported_by_location(server, model):
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "user", "content": "Again", "name": "alice"},
        ],
        "max_tokens": 2,
        "user": "someone",
        "foo": {"bar": 1},
    }
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=body)
        clean = http.post("/v1/chat/completions", json=chat_body(model, max_tokens=2))
    assert response.status_code == 200
    assert _ignored(response) == ["messages[2].name", "user", "foo"]
    assert "x-millm-ignored-fields" not in clean.headers
    assert response.json().keys() == clean.json().keys()


def test_nested_extra_messages_locations(server, model):
    body = chat_body(
        model,
        max_tokens=1,
        extra_messages=[[{"role": "user", "content": "a"}, {"role": "user", "content": "b", "weight": 2}]],
    )
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert _ignored(response) == ["extra_messages[0][1].weight"]
    assert len(response.json()["choices"]) == 2


def test_report_on_streams_too(server, model):
    with server.http() as http:
        response, events = stream_post(
            http, "/v1/chat/completions", chat_body(model, max_tokens=2, stream=True, user="u")
        )
    assert _ignored(response) == ["user"] and events[-1] == "[DONE]"


def test_header_is_capped_with_a_count(server, model):
    extra = {f"field_{i:03d}_with_a_long_name": i for i in range(200)}
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=chat_body(model, max_tokens=1, **extra))
    header = response.headers["x-millm-ignored-fields"]
    assert len(header.encode()) <= 1024
    items = _ignored(response)
    assert items[-1] == f"+{200 - (len(items) - 1)} more"
    assert items[:-1] == list(extra)[: len(items) - 1]


def test_non_printable_names_are_percent_encoded(server, model):
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=chat_body(model, max_tokens=1, **{"caf\u00e9\n": 1}))
    assert _ignored(response) == ["caf%C3%A9%0A"]


def test_one_log_warning_with_locations_never_values(server, model):
    with server.http() as http:
        http.post("/v1/chat/completions", json=chat_body(model, max_tokens=1, secret_field="SECRET-VALUE-42"))
    log = server.log()
    lines = [line for line in log.splitlines() if "request_fields_unused" in line and "secret_field" in line]
    assert len(lines) == 1
    assert "SECRET-VALUE-42" not in log


@pytest.mark.parametrize("value", ["true", "1", "TRUE"])
def test_strict_mode_refuses_every_unused_location(server, model, value):
    body = {**chat_body(model, max_tokens=1, user="u", foo=1)}
    body["messages"][0]["name"] = "n"
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=body, headers={"X-miLLM-Strict": value})
    error = assert_error(response, 400, "unused_fields_refused")
    for location in ("messages[0].name", "user", "foo"):
        assert location in error["message"]


@pytest.mark.parametrize("value", ["false", "0"])
def test_strict_off_reports(server, model, value):
    with server.http() as http:
        response = http.post(
            "/v1/chat/completions", json=chat_body(model, max_tokens=1, user="u"), headers={"X-miLLM-Strict": value}
        )
    assert response.status_code == 200 and _ignored(response) == ["user"]


def test_strict_with_another_value_names_the_header(server, model):
    with server.http() as http:
        response = http.post(
            "/v1/chat/completions", json=chat_body(model, max_tokens=1), headers={"X-miLLM-Strict": "yes"}
        )
    assert_error(response, 400, "invalid_parameter", "X-miLLM-Strict")


REFUSED = [
    # (endpoint, field, value) refused: nothing claims them for the echo engine
    ("completions", "top_logprobs", 2),
    ("completions", "response_format", {"type": "json_object"}),
    ("completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("completions", "prompt_logprobs", 1),  # echo alone is served everywhere; with logprobs it needs scoring
    ("completions", "ignore_eos", True),
    ("completions", "best_of", 3),
    ("completions", "suffix", "end"),
    ("chat.completions", "dimensions", 16),
    ("chat.completions", "pooling", "last"),
    ("chat.completions", "normalize", True),
    ("chat.completions", "functions", [{"name": "f"}]),
]


def _body(endpoint: str, model: str, **fields):
    if endpoint == "completions":
        return {"model": model, "prompt": "Hello", "max_tokens": 1, **fields}
    return chat_body(model, max_tokens=1, **fields)


@pytest.mark.parametrize("endpoint,field,value", REFUSED)
def test_output_changing_fields_are_refused_not_ignored(server, model, endpoint, field, value):
    path = "/v1/chat/completions" if endpoint == "chat.completions" else "/v1/completions"
    with server.http() as http:
        response = http.post(path, json=_body(endpoint, model, **{field: value}))
    assert_error(response, 400, "field_not_honoured", field)


def test_refusal_happens_before_any_model_load(app_factory):
    # Another model is on disk but not resident: a refused field must not load it.
    server = app_factory(models={"echo": {}, "echo-other": {}})
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=chat_body("echo-other", functions=[{"name": "f"}]))
        health = http.get("/api/health").json()
    assert_error(response, 400, "field_not_honoured", "functions")
    assert health["model"] == "echo"


NO_CHANGE = {
    "n": 1,
    "logprobs": False,
    "response_format": {"type": "text"},
    "tools": [],
    "tool_choice": "none",
    "parallel_tool_calls": True,
    "logit_bias": {},
    "pooling": "mean",
    "normalize": False,
    "scoring_precision": "native",
    "dimensions": None,
    "seed": None,
    "with_unsteered": False,
}


@pytest.mark.parametrize("endpoint", ["chat.completions", "completions"])
def test_no_change_values_are_accepted_everywhere(server, model, endpoint):
    path = "/v1/chat/completions" if endpoint == "chat.completions" else "/v1/completions"
    with server.http() as http:
        response = http.post(path, json=_body(endpoint, model, **NO_CHANGE))
    assert response.status_code == 200, response.text


def test_image_content_parts_are_refused(server, model):
    body = {
        "model": model,
        "max_tokens": 1,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "data:,"}},
                ],
            }
        ],
    }
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=body)
        text_parts = http.post(
            "/v1/chat/completions",
            json={
                **body,
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]}
                ],
            },
        )
    assert_error(response, 400, "field_not_honoured", "messages[0].content[1]")
    assert text_parts.status_code == 200


def test_a_plugin_s_output_changing_field_is_refused_wherever_it_is_unclaimed():
    """Output-changing and scorable flags come with the claim: a server without the plugin reports the
    field (it knows nothing of it), one with it refuses the field where the claim does not reach."""
    from millm_host import default_fields
    from millm_host.engine import EngineSpec
    from millm_host.errors import FieldNotHonoured
    from millm_host.fields import FieldRegistry, check_fields

    engines = [
        EngineSpec(
            name="hooked", factory="x:X", describe="x:d", formats=frozenset(), capabilities=frozenset({"layer_hooks"})
        )
    ]
    engines.append(EngineSpec(name="plain", factory="x:X", describe="x:d", formats=frozenset()))
    body = {"model": "m", "prompt": "Hi", "dial": 0.5}
    without = FieldRegistry(engines)
    default_fields.register_request_fields(without.register)
    assert check_fields(without, "completions", "plain", body, strict=False) == ["dial"]
    assert "dial" not in without.unscorable

    registry = FieldRegistry(engines)
    default_fields.register_request_fields(registry.register)
    registry.register("completions", ["dial"], requires="layer_hooks", output_changing=True, scorable=False)
    assert check_fields(registry, "completions", "hooked", body, strict=False) == []
    for endpoint, engine in (("completions", "plain"), ("chat.completions", "hooked")):
        with pytest.raises(FieldNotHonoured) as refused:
            check_fields(registry, endpoint, engine, body, strict=False)
        assert refused.value.param == "dial"
    assert "dial" in registry.unscorable and "profile" in FieldRegistry(engines).output_changing  # the spec's table
