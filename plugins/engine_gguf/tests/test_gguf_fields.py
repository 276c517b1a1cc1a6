"""Every field on a GGUF model is honoured, reported or refused, and oversized prompts are 400s.

Refusals target a model that is not resident: a refusal must come before any
load, and the resident model must stay where it is.
"""

from __future__ import annotations

import openai
import pytest

from millm_host.api import parse_list
from millm_host.testing import assert_error

from .conftest import DEFAULT_ID, N_CTX, SOLO_ID, STEERING as STEERING_INSTALLED

MESSAGES = [{"role": "user", "content": "Say hello."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
STEERING = {"features": [{"index": 1, "strength": 2.0}]}

SCORING_AND_STEERING = [
    ("seed", 7),
    ("n", 2),
    ("allowed_token_ids", [1, 2]),
    ("return_tokens_as_token_ids", True),
    ("scoring_precision", "float32"),
    ("response_format", {"type": "json_object"}),
    ("tools", TOOLS),
    ("tool_choice", "auto"),
    ("return_sae_activations", {"features": [1]}),  # no layer to read (steering is served: control vectors)
    ("with_unsteered", True),  # the unsteered rows need layer hooks apart from the steered ones
]
CHAT_REFUSED = [("chat.completions", f, v) for f, v in SCORING_AND_STEERING]
COMPLETIONS_REFUSED = [
    ("completions", f, v)
    for f, v in [
        ("seed", 7),
        ("n", 2),
        ("allowed_token_ids", [1, 2]),
        ("return_tokens_as_token_ids", True),
        ("scoring_precision", "float32"),
        ("prompt_logprobs", 1),  # the prompt's logprobs are scoring's pass, which llama.cpp is not loaded for
        ("best_of", 2),
        ("suffix", "!"),
        ("response_format", {"type": "json_object"}),
        ("with_unsteered", True),
    ]
]
NO_CHANGE = [
    ("n", 1),
    ("logprobs", False),
    ("response_format", {"type": "text"}),
    ("tools", []),
    ("tool_choice", "none"),
    ("parallel_tool_calls", True),
    ("logit_bias", {}),
    ("seed", None),
    ("with_unsteered", False),
]


def body(endpoint: str, model: str, **fields) -> dict:
    base = {"model": model, "max_tokens": 2}
    base.update({"messages": MESSAGES} if endpoint == "chat.completions" else {"prompt": "Hello"})
    return {**base, **fields}


def post(server, endpoint: str, payload: dict):
    return server.http().post("/v1/" + endpoint.replace(".", "/"), json=payload)


def model_state(server, model_id: str) -> str:
    return server.http().get(f"/api/models/{model_id}").json()["state"]


def ignored(response) -> list[str]:
    header = response.headers.get("x-millm-ignored-fields")
    return [] if header is None else [item.value for item in parse_list(header)]


@pytest.mark.parametrize(
    ("endpoint", "field", "value"), CHAT_REFUSED + COMPLETIONS_REFUSED, ids=lambda v: v if isinstance(v, str) else None
)
def test_unhonoured_fields_are_refused_before_any_load(gguf_server, endpoint, field, value):
    response = post(gguf_server, endpoint, body(endpoint, SOLO_ID, **{field: value}))
    assert assert_error(response, 400, "field_not_honoured", field)["type"] == "invalid_request_error"
    assert model_state(gguf_server, SOLO_ID) == "READY"
    assert model_state(gguf_server, DEFAULT_ID) == "LOADED"


@pytest.mark.parametrize("endpoint", ["chat.completions", "completions"])
def test_steering_is_served_and_checked_before_any_load(gguf_server, endpoint):
    """The steering fields are honoured on GGUF (llama.cpp control vectors; ``test_gguf_steering_http``):
    an inline set for a model that is not resident is refused (no SAE can be attached to it) before a load.
    Without the steering plugin (the light setup) the field is refused as not honoured, also before a load."""
    response = post(gguf_server, endpoint, body(endpoint, SOLO_ID, steering=STEERING))
    assert_error(response, 400, "SAE_NOT_ATTACHED" if STEERING_INSTALLED else "field_not_honoured", "steering")
    assert model_state(gguf_server, SOLO_ID) == "READY"
    assert model_state(gguf_server, DEFAULT_ID) == "LOADED"


def test_echo_is_served_but_not_with_logprobs(gguf_server):
    """``echo`` alone puts the prompt before the completion; with ``logprobs`` (the prompt's logprobs) it is
    refused before any load: a GGUF model cannot score (llama.cpp would need every position's logits kept)."""
    refused = post(gguf_server, "completions", body("completions", SOLO_ID, echo=True, logprobs=1))
    assert "cannot score" in assert_error(refused, 400, "field_not_honoured", "echo")["message"]
    assert model_state(gguf_server, SOLO_ID) == "READY"
    served = post(gguf_server, "completions", body("completions", DEFAULT_ID, echo=True, temperature=0))
    assert served.status_code == 200 and served.json()["choices"][0]["text"].startswith("Hello")


def test_n_above_one_is_refused_through_the_sdk(gguf_server):
    with pytest.raises(openai.BadRequestError) as caught:
        gguf_server.openai().chat.completions.create(model=SOLO_ID, messages=MESSAGES, n=2)
    assert (caught.value.body["code"], caught.value.body["param"]) == ("field_not_honoured", "n")


@pytest.mark.parametrize(("field", "value"), NO_CHANGE, ids=[f for f, _ in NO_CHANGE])
def test_no_change_values_are_accepted(gguf_server, field, value):
    response = post(gguf_server, "chat.completions", body("chat.completions", DEFAULT_ID, **{field: value}))
    assert response.status_code == 200, response.text
    assert field not in ignored(response)


def test_chat_template_kwargs_are_reported_and_change_nothing(gguf_server):
    plain = post(gguf_server, "chat.completions", body("chat.completions", DEFAULT_ID, temperature=0, max_tokens=12))
    response = post(
        gguf_server,
        "chat.completions",
        body(
            "chat.completions",
            DEFAULT_ID,
            temperature=0,
            max_tokens=12,
            chat_template_kwargs={"enable_thinking": False},
        ),
    )
    assert response.status_code == 200
    assert ignored(response) == ["chat_template_kwargs"]
    assert response.json()["choices"] == plain.json()["choices"]


def test_tool_call_history_is_reported(gguf_server):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        {"role": "user", "content": "So?"},
    ]
    response = post(gguf_server, "chat.completions", {"model": DEFAULT_ID, "messages": messages, "max_tokens": 4})
    assert response.status_code == 200, response.text
    assert set(ignored(response)) == {"messages[1].tool_calls", "messages[2].tool_call_id"}


def long_text(tokens: int) -> str:
    return "apple " * tokens  # one token per word on SmolLM2


@pytest.mark.parametrize("stream", [False, True])
def test_oversized_chat_prompt_is_context_length_exceeded(gguf_server, stream):
    with pytest.raises(openai.BadRequestError) as caught:
        gguf_server.openai().chat.completions.create(
            model=DEFAULT_ID, messages=[{"role": "user", "content": long_text(N_CTX + 50)}], stream=stream
        )
    error = caught.value.body
    assert (caught.value.status_code, error["code"], error["param"]) == (400, "context_length_exceeded", "messages")
    assert str(N_CTX) in error["message"]
    prompt_tokens = int(error["message"].split("(")[1].split(" in the prompt")[0])
    assert prompt_tokens > N_CTX


def test_prompt_plus_max_tokens_over_the_window_names_both_counts(gguf_server):
    with pytest.raises(openai.BadRequestError) as caught:
        gguf_server.openai().completions.create(model=DEFAULT_ID, prompt=long_text(400), max_tokens=200)
    error = caught.value.body
    assert (error["code"], error["param"]) == ("context_length_exceeded", "max_tokens")
    assert f"maximum context length is {N_CTX} tokens" in error["message"]
    assert "200 for the completion" in error["message"]


def test_a_prompt_near_the_window_fills_it_and_stops(gguf_server):
    reply = gguf_server.openai().completions.create(model=DEFAULT_ID, prompt=long_text(N_CTX - 8), temperature=0)
    assert reply.usage.total_tokens <= N_CTX
    if reply.choices[0].finish_reason == "length":  # the default max_tokens is the room left
        assert reply.usage.total_tokens == N_CTX
    assert gguf_server.http().get("/api/health").json()["status"] == "ok"
