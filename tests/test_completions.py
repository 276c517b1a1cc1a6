"""Text completions: prompts verbatim, one choice per prompt.

Rendering and refusals run in-process on the echo engine (``echo_app``, which
answers with the prompt); real tokens and sampling on a tiny model in a real server.
"""

from __future__ import annotations

import pytest

from millm_host.testing import assert_error, stream_post
from millm_host.testing.openai_schema import validate_openai


@pytest.fixture(scope="module")
def model_id(tiny_server) -> str:
    return tiny_server.model_id


def test_prompt_list_gives_one_choice_per_prompt(echo_app):
    with echo_app.http() as http:
        response = http.post(
            "/v1/completions",
            json={
                "model": "echo",
                "prompt": ["Once upon", "A B C", "1 2 3"],
                "max_tokens": 4,
                "temperature": 0,
            },
        )
    assert response.status_code == 200
    body = response.json()
    validate_openai("CreateCompletionResponse", body)
    assert body["object"] == "text_completion"
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, "Once"), (1, "A B "), (2, "1 2 ")]
    single = echo_app.openai().completions.create(model="echo", prompt="A B C", max_tokens=4, temperature=0)
    assert single.choices[0].text == body["choices"][1]["text"]


def test_token_id_prompt_equals_text_prompt(tiny_server, model_id, tiny_model_dir):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer("Once upon a time")["input_ids"]
    client = tiny_server.openai()
    by_text = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=6, temperature=0)
    by_ids = client.completions.create(model=model_id, prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_streamed_completion(echo_app):
    body = {"model": "echo", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stream": True}
    with echo_app.http() as http:
        response, events = stream_post(http, "/v1/completions", body)
        whole = http.post("/v1/completions", json={**body, "stream": False}).json()
    assert events[-1] == "[DONE]"
    for chunk in events[:-1]:
        # OpenAI publishes no schema for streamed completions; its chunks are
        # CreateCompletionResponse objects with finish_reason null until the last.
        settled = {
            **chunk,
            "choices": [{**c, "finish_reason": c["finish_reason"] or "length"} for c in chunk["choices"]],
        }
        validate_openai("CreateCompletionResponse", settled)
    text = "".join(c["choices"][0]["text"] for c in events[:-1])  # every chunk has a choice
    assert text == whole["choices"][0]["text"] == "Once upo"
    assert events[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


def test_completion_seed_and_stop(tiny_server, model_id):
    client = tiny_server.openai()
    first = client.completions.create(model=model_id, prompt="Hello", max_tokens=12, temperature=1, seed=5)
    second = client.completions.create(model=model_id, prompt="Hello", max_tokens=12, temperature=1, seed=5)
    assert first.choices[0].text == second.choices[0].text
    full = client.completions.create(model=model_id, prompt="Hello", max_tokens=24, temperature=0).choices[0].text
    stop = full[6:9]
    cut = client.completions.create(model=model_id, prompt="Hello", max_tokens=24, temperature=0, stop=stop)
    assert cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("prompt", ["", [], [""], [[]], {"a": 1}, [1, "a"]])
def test_bad_prompts_are_refused(echo_app, prompt):
    with echo_app.http() as http:
        response = http.post("/v1/completions", json={"model": "echo", "prompt": prompt, "max_tokens": 2})
    assert_error(response, 400, "invalid_parameter")


def test_token_ids_outside_the_vocabulary_are_refused(echo_app):
    with echo_app.http() as http:
        response = http.post("/v1/completions", json={"model": "echo", "prompt": [1, 10**9], "max_tokens": 2})
    assert_error(response, 400, "invalid_parameter", "prompt")
