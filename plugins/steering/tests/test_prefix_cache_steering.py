"""Prefix caching (the transformers engine's continuous batch) beside steering and ``return_sae_activations``.

A prompt sent again reuses its earlier keys and values (``cached_tokens``), and
answers what it answered cold: the same tokens, and the SAE activations of every
position, reused ones included, within 1e-4 (the reader's reads are replayed from
what the cold run's reads saw). Steering is part of the key: a steered prompt
reuses only a prompt computed under the same steering.
"""

from __future__ import annotations

LONG = "The lighthouse keeper climbed the winding stairs every evening to light the lamp. "


def complete(client, model_id, prompt, **fields) -> dict:
    body = {
        "model": model_id,
        "prompt": prompt,
        "max_tokens": 4,
        "temperature": 0,
        "return_sae_activations": {"positions": "all", "top_k": 5},
        **fields,
    }
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def cached(body: dict) -> int:
    return (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def same_reads(first: dict, second: dict) -> None:
    """Every position's top features equal, their values within 1e-4."""
    a, b = first["millm"]["sae_activations"]["positions"], second["millm"]["sae_activations"]["positions"]
    assert [p["position"] for p in a] == [p["position"] for p in b]
    for one, two in zip(a, b, strict=True):
        assert [f["index"] for f in one["features"]] == [f["index"] for f in two["features"]], one["position"]
        for x, y in zip(one["features"], two["features"], strict=True):
            assert abs(x["value"] - y["value"]) < 1e-4, (one["position"], x, y)


def test_a_prompt_sent_again_reuses_its_prefix_and_reads_and_answers_as_cold(client, model_id, attach):
    attach("cache-reader", d_sae=96)
    prompt = LONG * 4 + "unsteered"
    cold = complete(client, model_id, prompt)
    warm = complete(client, model_id, prompt)
    assert cached(cold) == 0 and cached(warm) == cold["usage"]["prompt_tokens"] - 1
    assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
    same_reads(cold, warm)


def test_steering_is_part_of_the_key(client, model_id, attach):
    attach("cache-steer", d_sae=96)
    prompt = "Steered. " + LONG * 4  # shares no prefix with another test's prompt
    plain = complete(client, model_id, prompt)
    steering = {"sae_id": "cache-steer", "features": [{"index": 3, "strength": 4.0}]}
    steered_cold = complete(client, model_id, prompt, steering=steering)
    assert cached(plain) == 0 and cached(steered_cold) == 0  # the unsteered prompt is not reused
    steered_warm = complete(client, model_id, prompt, steering=steering)
    assert cached(steered_warm) == steered_cold["usage"]["prompt_tokens"] - 1
    assert steered_warm["choices"][0]["text"] == steered_cold["choices"][0]["text"]
    same_reads(steered_cold, steered_warm)
    other = {"sae_id": "cache-steer", "features": [{"index": 3, "strength": -4.0}]}
    assert cached(complete(client, model_id, prompt, steering=other)) == 0
