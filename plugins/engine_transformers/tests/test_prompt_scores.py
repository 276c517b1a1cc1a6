"""A prompt's own scores (echo, prompt_logprobs) in chunks of positions equal the one pass over it."""

from __future__ import annotations

import torch
import transformers

from millm_engine_transformers.scoring import prompt_scores
from millm_host.testing.tiny_models import tiny_llama


def test_a_prompt_scored_in_chunks_equals_one_pass_and_holds_one_chunk():
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama("prompt-scores", seed=3)).eval()
    ids = list(range(5, 5 + 70))
    whole = prompt_scores(model, ids, torch.device("cpu"), 3, 0, "past_key_values", chunk=1000)
    chunked = prompt_scores(model, ids, torch.device("cpu"), 3, 0, "past_key_values", chunk=16)
    assert len(whole) == len(chunked) == len(ids) - 1
    for one, other in zip(whole, chunked, strict=True):
        assert one.token.token_id == other.token.token_id and one.rank == other.rank
        assert abs(one.token.logprob - other.token.logprob) <= 1e-5
        assert [t.token_id for t in one.top] == [t.token_id for t in other.top]
    with torch.inference_mode():  # the one pass is scoring's own: the full forward's log-softmax
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    expected = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    assert max(abs(s.token.logprob - e) for s, e in zip(whole, expected.tolist(), strict=True)) <= 1e-6
    assert prompt_scores(model, ids[:1], torch.device("cpu"), 3, 0, "past_key_values") == []
