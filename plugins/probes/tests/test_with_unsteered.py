"""Both replies in one request (``with_unsteered``) and per-token probe scores (``probe_token_scores``).

Through the official ``openai`` SDK (``extra_body``), on the tiny model with an SAE the test writes,
attached at layer 1, and a probe armed one layer later. Under greedy decoding the steered reply equals
the request sent without the field, token for token, and the unsteered reply the request sent with
steering off (``steering: {"features": []}``); each choice says which it is, and each carries its own
reply's verdicts.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

pytest.importorskip("millm_steering")
openai = pytest.importorskip("openai")

SAE_ID = "with-unsteered-sae"
STEER = {"sae_id": SAE_ID, "features": [{"index": 3, "strength": 120.0}, {"index": 9, "strength": -80.0}]}
OFF = {"features": []}
CHAT = [{"role": "user", "content": "Describe a mountain at dawn."}]
PROMPT = "The mountain at dawn"
TOKENS = 12
SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "docs" / "schemas" / "probe-result-v1.json").read_text())


@pytest.fixture
def steered(api, lab, identity, helpers, sae_dir):
    """The SAE attached at layer 1's output; a probe reading the response one layer later (its id)."""
    doc = lab.definition(identity, name="after-steering", layer=2, windows=["response"])
    with helpers.attached_sae(api, lab, sae_dir, SAE_ID, layer=1, seed=21), helpers.armed(api, [doc]) as (probe_id,):
        yield probe_id


@pytest.fixture
def client(probes_server):
    return probes_server.openai()


def chat(client, model_id, steering, **extra):
    body = {"steering": steering, "logprobs": True, **extra}
    return client.chat.completions.with_raw_response.create(
        model=model_id, messages=CHAT, max_tokens=TOKENS, temperature=0, extra_body=body
    )


def tokens(choice) -> list[str]:
    return [t.token for t in choice.logprobs.content]


def verdicts(container) -> list[dict]:
    return [r for r in (container.model_extra or {}).get("millm_probe_verdicts") or [] if r["kind"] == "probe"]


def same_reading(a: list[dict], b: list[dict]) -> None:
    assert [(r["probe_id"], r["window"], r["outcome"], r["n_scored_tokens"]) for r in a] == [
        (r["probe_id"], r["window"], r["outcome"], r["n_scored_tokens"]) for r in b
    ]
    for x, y in zip(a, b, strict=True):
        assert x["score"] == pytest.approx(y["score"], abs=1e-4)
        assert x["fires"] == y["fires"]


def test_both_replies_equal_the_plain_requests(client, model_id, steered):
    raw = chat(client, model_id, STEER, with_unsteered=True)
    both = raw.parse()
    plain = chat(client, model_id, STEER)
    off = chat(client, model_id, OFF).parse()
    steered_choice, unsteered_choice = both.choices
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.model_extra["millm_variant"] for c in both.choices] == ["steered", "unsteered"]
    assert tokens(steered_choice) == tokens(plain.parse().choices[0])
    assert tokens(unsteered_choice) == tokens(off.choices[0])
    assert steered_choice.message.content == plain.parse().choices[0].message.content
    assert unsteered_choice.message.content == off.choices[0].message.content
    assert steered_choice.message.content != unsteered_choice.message.content  # the steering shows
    # The header describes the steered reply, as it does for the plain steered request.
    assert raw.headers["x-millm-steering"] == plain.headers["x-millm-steering"] != "none"
    # Each reply its own verdicts; the body's list stays the steered reply's (what old clients read).
    assert len(verdicts(steered_choice)) == len(verdicts(unsteered_choice)) == 1
    assert {r["variant"] for r in verdicts(steered_choice)} == {"steered"}
    assert {r["variant"] for r in verdicts(unsteered_choice)} == {"unsteered"}
    assert [r["result_id"] for r in verdicts(both)] == [r["result_id"] for r in verdicts(steered_choice)]
    same_reading(verdicts(steered_choice), verdicts(plain.parse()))
    same_reading(verdicts(unsteered_choice), verdicts(off))
    assert both.usage.completion_tokens == plain.parse().usage.completion_tokens + off.usage.completion_tokens


def test_streamed_replies_equal_the_plain_requests(client, model_id, steered):
    stream = client.chat.completions.create(
        model=model_id,
        messages=CHAT,
        max_tokens=TOKENS,
        temperature=0,
        stream=True,
        extra_body={"steering": STEER, "with_unsteered": True},
    )
    text = {0: "", 1: ""}
    roles: dict[int, str] = {}
    finals: dict[int, dict] = {}
    for chunk in stream:
        for choice in chunk.choices:
            assert choice.model_extra["millm_variant"] == ("steered" if choice.index == 0 else "unsteered")
            text[choice.index] += choice.delta.content or ""
            if choice.delta.role:
                roles[choice.index] = choice.delta.role
            if choice.finish_reason is not None:
                finals[choice.index] = choice.model_extra
    plain = chat(client, model_id, STEER).parse()
    off = chat(client, model_id, OFF).parse()
    assert text == {0: plain.choices[0].message.content, 1: off.choices[0].message.content}
    assert roles == {0: "assistant", 1: "assistant"}  # each reply opens with its role
    # Each choice's finish chunk carries its own reply's verdicts.
    assert {r["variant"] for r in finals[0]["millm_probe_verdicts"]} == {"steered"}
    assert {r["variant"] for r in finals[1]["millm_probe_verdicts"]} == {"unsteered"}
    same_reading(finals[0]["millm_probe_verdicts"], verdicts(plain))
    same_reading(finals[1]["millm_probe_verdicts"], verdicts(off))


def test_text_completions_and_seeded_sampling(client, model_id, steered):
    """n choices of each reply, steered first; choice k of each draws from the same seed as the plain request's."""
    body = {"steering": STEER, "with_unsteered": True}
    sampled = {"temperature": 1.0, "seed": 1234, "n": 2, "max_tokens": TOKENS}
    both = client.completions.create(model=model_id, prompt=PROMPT, extra_body=body, **sampled)
    plain = client.completions.create(model=model_id, prompt=PROMPT, extra_body={"steering": STEER}, **sampled)
    off = client.completions.create(model=model_id, prompt=PROMPT, extra_body={"steering": OFF}, **sampled)
    assert [(c.index, c.model_extra["millm_variant"]) for c in both.choices] == [
        (0, "steered"),
        (1, "steered"),
        (2, "unsteered"),
        (3, "unsteered"),
    ]
    assert [c.text for c in both.choices] == [c.text for c in plain.choices] + [c.text for c in off.choices]


def test_nothing_steers_both_replies_are_equal(client, model_id):
    """With nothing attached both replies are served, and equal; they share one prefill (a prompt no
    request here sent before: the second reply reuses all of the first's but its last token)."""
    fresh = [{"role": "user", "content": "Describe a mountain at dawn, in a single breath."}]
    both = client.chat.completions.create(
        model=model_id, messages=fresh, max_tokens=TOKENS, temperature=0, extra_body={"with_unsteered": True}
    )
    assert both.choices[0].message.content == both.choices[1].message.content
    assert both.usage.prompt_tokens_details.cached_tokens == both.usage.prompt_tokens - 1


def test_refused_in_scoring_mode(probes_server, model_id):
    with probes_server.http() as http:
        body = {"model": model_id, "prompt": PROMPT, "max_tokens": 1, "logprobs": 2, "with_unsteered": True}
        response = http.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "with_unsteered"


def byte_characters() -> dict[int, str]:
    """GPT-2's byte-level BPE alphabet: each byte as the character its vocabulary writes it with."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def generated_ids(tokenizer, choice) -> list[int]:
    """The reply's token ids, from each token's ``bytes`` (the byte-level BPE vocabulary read backwards)."""
    decoder = {v: k for k, v in byte_characters().items()}
    by_bytes: dict[bytes, int] = {}
    for token, i in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        if all(c in decoder for c in token):
            by_bytes.setdefault(bytes(decoder[c] for c in token), i)
    return [by_bytes[bytes(t.bytes)] for t in choice.logprobs.content]


def test_token_scores_are_the_stateless_per_token_scores(client, api, lab, model_id, steered):
    """One score per reply token with a residual, at absolute positions, equal to the stateless scoring's."""
    reply = chat(client, model_id, OFF, probe_token_scores=True).parse()
    (result,) = verdicts(reply)
    scores = result["token_scores"]
    prompt_tokens, generated = reply.usage.prompt_tokens, reply.usage.completion_tokens
    # Positions count prompt then generated tokens; the response window's are the generated tokens with a
    # residual: all of them, but the last when max_tokens cut the reply (it was never fed forward).
    last = prompt_tokens + generated - (1 if reply.choices[0].finish_reason == "length" else 0)
    assert scores["positions"] == list(range(prompt_tokens, last))
    assert len(scores["scores"]) == result["n_scored_tokens"] == len(scores["positions"])
    prompt = api.post("/tokenize", json={"model": model_id, "messages": CHAT}).json()["tokens"]
    assert len(prompt) == prompt_tokens
    ids = prompt + generated_ids(lab.tokenizer, reply.choices[0])
    body = {
        "probe_ids": [steered],
        "token_scores": True,
        "inputs": [{"token_ids": ids, "prompt_tokens": prompt_tokens}],
    }
    stateless = api.post("/api/probes/score", json=body)
    assert stateless.status_code == 200, stateless.text
    (offline,) = stateless.json()["results"][0]["results"]
    n = len(scores["positions"])  # the stateless pass also reads the last token
    assert offline["token_scores"]["positions"][:n] == scores["positions"]
    assert offline["token_scores"]["scores"][:n] == pytest.approx(scores["scores"], abs=1e-4)
    assert json.loads(json.dumps(result, allow_nan=False)) == result  # plain JSON: a non-finite score is null


def test_token_scores_per_reply_with_both_replies(client, model_id, steered):
    both = chat(client, model_id, STEER, with_unsteered=True, probe_token_scores=True).parse()
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for choice in both.choices:
        (result,) = verdicts(choice)
        assert len(result["token_scores"]["scores"]) == result["n_scored_tokens"] > 0
        validator.validate(result)  # token_scores and variant as the published schema describes them


def test_token_scores_must_be_a_boolean(probes_server, model_id):
    with probes_server.http() as http:
        body = {"model": model_id, "messages": CHAT, "max_tokens": 1, "probe_token_scores": "yes"}
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "probe_token_scores"


def test_streamed_text_completion_of_two_prompts(client, model_id, steered):
    """Two prompts: four choices (two steered, then two unsteered), streamed as the whole body says."""
    prompts = [PROMPT, "A lighthouse keeper"]
    body = {"steering": STEER, "with_unsteered": True}
    whole = client.completions.create(model=model_id, prompt=prompts, max_tokens=TOKENS, temperature=0, extra_body=body)
    text: dict[int, str] = {}
    variants: dict[int, str] = {}
    stream = client.completions.create(
        model=model_id, prompt=prompts, max_tokens=TOKENS, temperature=0, stream=True, extra_body=body
    )
    for chunk in stream:
        for choice in chunk.choices:
            text[choice.index] = text.get(choice.index, "") + choice.text
            variants[choice.index] = choice.model_extra["millm_variant"]
    assert [(c.index, c.model_extra["millm_variant"]) for c in whole.choices] == sorted(variants.items())
    assert [c.text for c in whole.choices] == [text[i] for i in range(4)]
    assert variants == {0: "steered", 1: "steered", 2: "unsteered", 3: "unsteered"}
