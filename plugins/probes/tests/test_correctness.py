"""Live and stateless scores equal an independent computation (transformers hidden states, numpy math).

Every aggregation rule, every window, with and without the template prefix, on
residual points before and after a layer. Tolerance 1e-4.
"""

from __future__ import annotations

import pytest

TOLERANCE = 1e-4
WINDOWS = ["all", "prompt", "response", "last_user"]
CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Where do foxes live?"},
    {"role": "assistant", "content": "In forests and towns."},
    {"role": "user", "content": "And what do they eat in winter, mostly?"},
]
MAX_TOKENS = 6

# (name, layer, hook point, rule, k, skip_template_prefix): two batches within PROBE_MAX_ARMED.
BATCHES = [
    [
        ("c-mean", 0, "resid_post", "mean", None, True),
        ("c-max", 1, "resid_pre", "max", None, False),
        ("c-last", 2, "resid_post", "last", None, True),
        ("c-attention", 1, "resid_post", "attention", None, False),
    ],
    [
        ("c-topk", 2, "resid_pre", "topk_mean", 3, True),
        ("c-mean-pre", 3, "resid_pre", "mean", None, False),
        ("c-attention-skip", 0, "resid_pre", "attention", None, True),
    ],
]


def expected_spans(lab, prompt, fed, skip):
    """Each window's [start, end) over the fed positions, computed from the ids here."""
    start = lab.template_prefix(fed) if skip else 0
    user_start, user_end = lab.last_user_span(prompt)
    return {
        "all": (start, len(fed)),
        "prompt": (start, len(prompt)),
        "response": (len(prompt), len(fed)),
        "last_user": (max(start, user_start), user_end),
    }


@pytest.mark.parametrize("batch", range(len(BATCHES)))
def test_live_and_stateless_scores_match_independent_computation(api, lab, identity, model_id, helpers, batch):
    docs = {}
    for spec in BATCHES[batch]:
        doc = lab.definition_of(identity, spec, windows=WINDOWS)
        skip = spec[-1]
        probe = helpers.import_probe(api, doc)
        helpers.arm(api, probe["id"])
        docs[probe["id"]] = (doc, skip)

    response = api.post(
        "/v1/chat/completions",
        json={"model": model_id, "messages": CONVERSATION, "max_tokens": MAX_TOKENS, "temperature": 0},
    )
    assert response.status_code == 200, response.text
    body = response.json()

    prompt = lab.chat_ids(CONVERSATION)
    generated = lab.greedy(prompt, MAX_TOKENS)
    assert body["usage"]["completion_tokens"] == len(generated)
    # The last generated token is never fed back unless EOS followed it.
    fed = prompt + (generated[:-1] if len(generated) == MAX_TOKENS else generated)

    results = body["millm_probe_verdicts"]
    assert len(results) == len(docs) * len(WINDOWS)
    for result in results:
        doc, skip = docs[result["probe_id"]]
        start, end = expected_spans(lab, prompt, fed, skip)[result["window"]]
        assert result["outcome"] == "completed", result
        assert result["n_scored_tokens"] == end - start, result
        expected = lab.score(doc, fed, start, end)
        assert abs(result["score"] - expected) <= TOLERANCE, (
            result["name"],
            result["window"],
            result["score"],
            expected,
        )
        assert result["verdict"] == (result["score"] >= doc["decision"]["threshold"])

    # Stateless scoring of the same ids and of the conversation, by the same code, unsteered.
    scored = api.post(
        "/api/probes/score",
        json={
            "probe_ids": list(docs),
            "inputs": [{"token_ids": fed, "prompt_tokens": len(prompt)}, {"messages": CONVERSATION}],
        },
    )
    assert scored.status_code == 200, scored.text
    by_ids, by_messages = scored.json()["results"]
    assert by_messages["n_tokens"] == len(prompt) and by_messages["prompt_tokens"] == len(prompt)
    for result in by_ids["results"]:
        doc, skip = docs[result["probe_id"]]
        if result["window"] == "last_user":
            assert (result["outcome"], result["reason"]) == ("skipped", "token_ids_have_no_turns")
            continue
        start, end = expected_spans(lab, prompt, fed, skip)[result["window"]]
        assert abs(result["score"] - lab.score(doc, fed, start, end)) <= TOLERANCE
    for result in by_messages["results"]:
        doc, skip = docs[result["probe_id"]]
        if result["window"] == "response":  # a conversation ending in a user turn is all prompt
            assert (result["outcome"], result["reason"]) == ("skipped", "no_scored_tokens")
            continue
        start, end = expected_spans(lab, prompt, prompt, skip)[result["window"]]
        assert result["n_scored_tokens"] == end - start
        assert abs(result["score"] - lab.score(doc, prompt, start, end)) <= TOLERANCE


def test_text_completions_are_monitored(api, lab, identity, model_id, helpers):
    doc = lab.definition(identity, name="completion-probe", rule="max", windows=WINDOWS, skip_prefix=True)
    probe = helpers.import_probe(api, doc)
    helpers.arm(api, probe["id"])
    text = "Once upon a time, in a quiet village by the sea,"
    response = api.post("/v1/completions", json={"model": model_id, "prompt": text, "max_tokens": 4, "temperature": 0})
    assert response.status_code == 200
    assert "x-millm-probe-verdicts" in response.headers
    prompt = lab.text_ids(text)
    generated = lab.greedy(prompt, 4)
    fed = prompt + (generated[:-1] if len(generated) == 4 else generated)
    results = {r["window"]: r for r in response.json()["millm_probe_verdicts"]}
    assert (results["last_user"]["outcome"], results["last_user"]["reason"]) == (
        "skipped",
        "text_completion_has_no_user_turn",
    )
    start = lab.template_prefix(fed)
    spans = {"all": (start, len(fed)), "prompt": (start, len(prompt)), "response": (len(prompt), len(fed))}
    for window, (a, b) in spans.items():
        assert results[window]["n_scored_tokens"] == b - a
        assert abs(results[window]["score"] - lab.score(doc, fed, a, b)) <= TOLERANCE
