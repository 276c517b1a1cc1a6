"""Chat scoring on /v1/chat/completions: tokenized as a generated chat, scored like completions."""

from __future__ import annotations

import pytest
import torch

from millm_host.testing import assert_error, chat as post_chat
from millm_host.testing.openai_schema import validate_openai

MESSAGES = [{"role": "system", "content": "Answer true or false."}, {"role": "user", "content": "Is the sky green?"}]
OTHER = [{"role": "user", "content": "Say something."}]


def chat(server, model=None, **body):
    """A one-token chat request (scoring when ``body`` asks for it) to ``server``."""
    with server.http() as client:
        return post_chat(client, model or server.model_id, **{"max_tokens": 1, **body})


def test_chat_scoring_equals_completion_scoring_of_the_rendered_prompt(tiny_server, reference):
    client = tiny_server.openai()
    model = tiny_server.model_id
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1, logprobs=True, top_logprobs=5)
    rendered = reference.chat_text(MESSAGES)
    assert rendered.startswith(reference.tokenizer.bos_token)  # the template writes its own BOS
    completion = client.completions.create(
        model=model, prompt=rendered, max_tokens=1, logprobs=5, extra_body={"add_special_tokens": False}
    )
    entry = reply.choices[0].logprobs.content[0]
    c = completion.choices[0].logprobs
    assert entry.token == c.tokens[0] and entry.logprob == c.token_logprobs[0]
    assert {t.token: t.logprob for t in entry.top_logprobs} == c.top_logprobs[0]
    assert reply.usage.prompt_tokens == completion.usage.prompt_tokens
    # ... and both equal a direct float32 forward of the template's ids (one BOS, none added).
    ids = reference.ids(rendered, add_special_tokens=False)
    assert ids[0] == reference.tokenizer.bos_token_id and reply.usage.prompt_tokens == len(ids)
    expected = reference.logprobs(ids)
    best = torch.topk(expected, 5)
    assert [t.logprob for t in entry.top_logprobs] == pytest.approx(best.values.tolist(), abs=1e-5)
    texts = [reference.tokenizer.decode([int(i)]) for i in best.indices]
    assert [t.token for t in entry.top_logprobs] == texts
    assert [t.bytes for t in entry.top_logprobs] == [list(t.encode()) for t in texts]
    assert reply.choices[0].message.content == reference.tokenizer.decode(
        [int(best.indices[0])], skip_special_tokens=True
    )
    assert reply.choices[0].finish_reason == "length"


def test_token_ids_as_keys_and_bytes(tiny_server, reference):
    body = chat(tiny_server, messages=MESSAGES, logprobs=True, top_logprobs=3, return_tokens_as_token_ids=True).json()
    validate_openai("CreateChatCompletionResponse", body)
    entry = body["choices"][0]["logprobs"]["content"][0]
    for item in [entry, *entry["top_logprobs"]]:
        token = int(item["token"].removeprefix("token_id:"))
        assert item["bytes"] == list(reference.tokenizer.decode([token]).encode())


def test_top_logprobs_count(tiny_server):
    zero = chat(tiny_server, messages=MESSAGES, logprobs=True, top_logprobs=0).json()
    absent = chat(tiny_server, messages=MESSAGES, logprobs=True).json()
    for body in (zero, absent):
        assert body["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    few = chat(tiny_server, messages=MESSAGES, logprobs=True, top_logprobs=20, allowed_token_ids=[11, 12, 13]).json()
    assert len(few["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 3  # min(top_logprobs, candidates)


def test_allowed_without_logprobs_constrains_the_token(tiny_server, reference):
    allowed = [1802, 3721]
    logits = reference.logits(reference.ids(reference.chat_text(MESSAGES), add_special_tokens=False))
    best = max(allowed, key=lambda t: float(logits[t]))
    body = chat(tiny_server, messages=MESSAGES, allowed_token_ids=allowed).json()
    validate_openai("CreateChatCompletionResponse", body)
    assert body["choices"][0]["logprobs"] is None
    assert body["choices"][0]["message"]["content"] == reference.tokenizer.decode([best], skip_special_tokens=True)


def test_extra_messages_score_each_conversation_in_turn(tiny_server):
    extra = [OTHER, MESSAGES[1:]]
    body = chat(tiny_server, messages=MESSAGES, extra_messages=extra, logprobs=True, top_logprobs=2).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    for choice, conversation in zip(body["choices"], [MESSAGES, *extra], strict=True):
        alone = chat(tiny_server, messages=conversation, logprobs=True, top_logprobs=2).json()["choices"][0]
        assert choice["logprobs"] == alone["logprobs"]
        assert choice["message"] == alone["message"]


def test_a_failing_conversation_fails_the_request_naming_it(tiny_server):
    reply = chat(
        tiny_server,
        messages=MESSAGES,
        extra_messages=[OTHER, [{"role": "user", "content": "word " * 600}]],
        logprobs=True,
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "extra_messages[1]"


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"top_logprobs": 2}, "invalid_parameter", "top_logprobs"),
        ({"logprobs": False, "top_logprobs": 2}, "invalid_parameter", "top_logprobs"),
        ({"logprobs": 3}, "invalid_parameter", "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "invalid_parameter", "top_logprobs"),
        ({"logprobs": True, "logit_bias": {"1": 5}}, "field_not_honoured", "logit_bias"),
        ({"logprobs": True, "n": 2}, "invalid_parameter", "n"),
        ({"logprobs": True, "scoring_precision": "float32"}, "field_not_honoured", "scoring_precision"),
        ({"logprobs": True, "tools": [{"type": "function", "function": {"name": "f"}}]}, "field_not_honoured", "tools"),
        ({"logprobs": True, "profile": "x"}, "field_not_honoured", "profile"),
        ({"allowed_token_ids": [10**7]}, "invalid_scoring_request", "allowed_token_ids"),
    ],
)
def test_chat_refusals(tiny_server, fields, code, param):
    assert_error(chat(tiny_server, messages=MESSAGES, **fields), 400, code, param)


def test_one_bos_when_the_tokenizer_adds_one_and_the_template_writes_one(bf16_server, extra_models):
    """Llama 3 style: chat scoring equals completion scoring of the render without special tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(extra_models["add_bos"])
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    single = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert tokenizer(rendered)["input_ids"] == [tokenizer.bos_token_id, *single]  # a naive server's two BOS

    def completion(**fields):
        with bf16_server.http() as client:
            return client.post(
                "/v1/completions",
                json={
                    "model": "add_bos",
                    "prompt": rendered,
                    "max_tokens": 1,
                    "logprobs": 5,
                    "return_tokens_as_token_ids": True,
                    **fields,
                },
            ).json()

    scored = chat(
        bf16_server, model="add_bos", messages=MESSAGES, logprobs=True, top_logprobs=5, return_tokens_as_token_ids=True
    ).json()
    entry = scored["choices"][0]["logprobs"]["content"][0]
    without = completion(add_special_tokens=False)
    assert scored["usage"]["prompt_tokens"] == without["usage"]["prompt_tokens"] == len(single)
    assert {t["token"]: t["logprob"] for t in entry["top_logprobs"]} == without["choices"][0]["logprobs"][
        "top_logprobs"
    ][0]
    doubled = completion()
    assert doubled["usage"]["prompt_tokens"] == len(single) + 1
    assert doubled["choices"][0]["logprobs"] != without["choices"][0]["logprobs"]


def test_no_chat_template_is_refused(bf16_server):
    assert_error(chat(bf16_server, model="no_template", messages=MESSAGES, logprobs=True), 400, "no_chat_template")
    generated = chat(bf16_server, model="no_template", messages=MESSAGES, max_tokens=2)
    assert generated.status_code == 200  # generation keeps its generic fallback
