"""Scoring and embeddings on the real default model (SmolLM2-135M-Instruct), against a direct forward."""

from __future__ import annotations

import pytest
import torch

from .conftest import Reference

pytestmark = pytest.mark.real_model

JUDGE = (
    "[kind] review\n[text] The soup was cold and the waiter ignored us for an hour.\n"
    "[question] Is this review positive?\n[options]\nfalse\ntrue\n[decision]:"
)


@pytest.fixture(scope="module")
def real_reference(default_server, default_checkpoint_dir) -> Reference:
    """The float32 checkpoint the server converted the bundled GGUF into, read directly."""
    return Reference(default_checkpoint_dir)


def test_a_judge_prompt_matches_a_direct_forward(default_server, real_reference):
    allowed = [real_reference.ids(" false")[0], real_reference.ids(" true")[0]]
    reply = default_server.openai().completions.create(
        model=default_server.model_id,
        prompt=JUDGE,
        max_tokens=1,
        temperature=1.0,
        logprobs=2,
        extra_body={"allowed_token_ids": allowed, "add_special_tokens": False, "return_tokens_as_token_ids": True},
    )
    logits = real_reference.logits(real_reference.ids(JUDGE, add_special_tokens=False))
    expected = torch.log_softmax(logits[allowed], dim=-1)
    top = reply.choices[0].logprobs.top_logprobs[0]
    for token, value in zip(allowed, expected.tolist(), strict=True):
        assert top[f"token_id:{token}"] == pytest.approx(value, abs=1e-5)


def test_chat_scoring_and_embeddings_match_a_direct_forward(default_server, real_reference):
    messages = [{"role": "user", "content": "Is Paris the capital of France? Answer yes or no."}]
    client = default_server.openai()
    chat = client.chat.completions.create(
        model=default_server.model_id, messages=messages, max_tokens=1, logprobs=True, top_logprobs=3
    )
    ids = real_reference.ids(real_reference.chat_text(messages), add_special_tokens=False)
    best = torch.topk(real_reference.logprobs(ids), 3)
    assert [t.logprob for t in chat.choices[0].logprobs.content[0].top_logprobs] == pytest.approx(
        best.values.tolist(), abs=1e-5
    )
    vector = client.embeddings.create(model=default_server.model_id, input="Paris").data[0].embedding
    expected = real_reference.last_hidden(real_reference.ids("Paris")).mean(0)
    # float32 rounding: the server's few-row products may take the other form of the same sum (small_batch)
    assert vector == pytest.approx(expected.tolist(), rel=1e-6, abs=1e-5)
