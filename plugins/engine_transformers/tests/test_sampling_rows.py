"""``choose_rows``: a batch's rows sampled at once draw what ``choose`` draws for each alone."""

from __future__ import annotations

import pytest
import torch

from millm_engine_transformers.sampling import choose, choose_rows
from millm_host.api import SamplingParams

VOCAB = 4096


def logits_batch(rows: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    """Random logits with what real ones have: ties (rounded values), masked tokens (-inf), a spread."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * 3
    logits[::2] = (logits[::2] * 4).round() / 4  # many exact ties
    masked = torch.rand(rows, vocab, generator=generator) < 0.2
    logits[1::3] = logits[1::3].masked_fill(masked[1::3], float("-inf"))  # a constraint's mask
    return logits


def params_batch(rows: int, seed: int) -> list[SamplingParams]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i in range(rows):
        temperature = 0.0 if i % 5 == 4 else float(torch.empty(1).uniform_(0.05, 2.0, generator=generator))
        top_p = 1.0 if i % 3 == 0 else float(torch.empty(1).uniform_(0.1, 0.99, generator=generator))
        out.append(SamplingParams(max_tokens=1, temperature=temperature, top_p=top_p, seed=seed * 100 + i))
    return out


def generators(params: list[SamplingParams]) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(p.seed) for p in params]


@pytest.mark.parametrize("seed", range(12))
def test_each_row_draws_what_it_draws_alone(seed):
    rows = 9
    logits, params = logits_batch(rows, seed), params_batch(rows, seed)
    alone_gens, batch_gens = generators(params), generators(params)
    for _ in range(4):  # several draws in a row: the generators stay in step too
        alone = [choose(logits[i].clone(), params[i], alone_gens[i]) for i in range(rows)]
        assert choose_rows(logits, params, batch_gens) == alone


@pytest.mark.parametrize("threads", [1, 2])
def test_at_the_default_models_vocabulary_on_one_thread_or_two(threads):
    rows, vocab = 8, 49152  # SmolLM2's
    logits, params = logits_batch(rows, 5, vocab), params_batch(rows, 5)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone_gens, batch_gens = generators(params), generators(params)
        alone = [choose(logits[i].clone(), params[i], alone_gens[i]) for i in range(rows)]
        assert choose_rows(logits, params, batch_gens) == alone
    finally:
        torch.set_num_threads(before)


def test_a_seeded_row_draws_the_same_whatever_its_batch_mates():
    logits, params = logits_batch(6, 99), params_batch(6, 99)
    mine = SamplingParams(max_tokens=1, temperature=0.8, top_p=0.9, seed=7)
    row = logits[2:3]
    alone = choose_rows(row, [mine], [torch.Generator().manual_seed(7)])
    for mates in (1, 3, 5):
        batch = torch.cat([logits[:mates], row])
        got = choose_rows(
            batch, [*params[:mates], mine], [*generators(params[:mates]), torch.Generator().manual_seed(7)]
        )
        assert got[-1] == alone[0]


def test_the_input_logits_are_left_alone():
    logits = logits_batch(4, 3)
    before = logits.clone()
    choose_rows(logits, params_batch(4, 3), generators(params_batch(4, 3)))
    assert torch.equal(torch.nan_to_num(logits), torch.nan_to_num(before))
