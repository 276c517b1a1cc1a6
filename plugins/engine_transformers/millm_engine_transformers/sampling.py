"""Choosing the next token: logit bias, penalties, temperature, nucleus, a per-request generator."""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence

import torch

from millm_host.api import GeneratedToken, SamplingParams, TokenLogprob

#: Temperatures this small are greedy: their limit is greedy, and dividing by them
#: overflows the logits to infinity (and the softmax to NaN).
GREEDY_BELOW = 1e-6


def generator_for(params: SamplingParams, device: torch.device) -> torch.Generator:
    """A generator of this request's own: seeded when a seed was sent, random otherwise."""
    seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


class Penalties:
    """What depends on the tokens generated so far: OpenAI's frequency and presence penalties, and
    vLLM's ``min_tokens`` (``SamplingParams.min_tokens``): the ``eos_ids`` get -inf until that many
    tokens were drawn (``ignore_eos``: all of them)."""

    def __init__(self, params: SamplingParams, vocab: int, device: torch.device, eos_ids: Collection[int] = ()) -> None:
        self.frequency = params.frequency_penalty
        self.presence = params.presence_penalty
        counting = bool(self.frequency or self.presence)
        self.counts = torch.zeros(vocab, device=device) if counting else None
        self.eos_until = params.min_tokens if eos_ids else 0
        self.eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device) if self.eos_until else None
        self.drawn = 0

    @property
    def active(self) -> bool:
        """Whether ``apply`` changes the next token's logits."""
        return self.counts is not None or self.drawn < self.eos_until

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.counts is not None:
            logits = logits - self.frequency * self.counts - self.presence * (self.counts > 0).float()
        if self.eos is not None and self.drawn < self.eos_until:
            logits = logits.index_fill(0, self.eos, float("-inf"))
        return logits

    def record(self, token: int) -> None:
        self.drawn += 1
        if self.counts is not None:
            self.counts[token] += 1


class LogitBias:
    """OpenAI's ``logit_bias``: fixed amounts added to some tokens' logits."""

    def __init__(self, params: SamplingParams, device: torch.device) -> None:
        self.active = bool(params.logit_bias)
        self.ids = torch.tensor(list(params.logit_bias), dtype=torch.long, device=device)
        self.values = torch.tensor(list(params.logit_bias.values()), dtype=torch.float32, device=device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return logits
        return logits.index_add(0, self.ids, self.values)


def with_logprobs(token: int, logits: torch.Tensor, params: SamplingParams) -> GeneratedToken:
    """``token`` with its log-probability and the ``params.logprobs`` best, under what ``choose`` drew from.

    That is ``logits`` (after bias, penalties and processors) over the temperature,
    unscaled when greedy, before the nucleus cut.
    """
    if params.temperature >= GREEDY_BELOW:
        logits = logits / params.temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    count = min(params.logprobs or 0, logprobs.numel())
    values, ids = torch.topk(logprobs, count)
    top = [TokenLogprob(i, v) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return GeneratedToken(token, float(logprobs[token]), top)


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The next token from 1-D float logits."""
    if params.temperature < GREEDY_BELOW:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cumulative > params.top_p
        drop[1:] = drop[:-1].clone()
        drop[0] = False  # always keep the most likely token
        logits = logits.scatter(0, order[drop], float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def choose_rows(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> list[int | Exception]:
    """The next token of each row of 2-D float logits, the one ``choose`` picks for that row alone.

    One argmax over the greedy rows; for the others one division by their temperatures, one
    nucleus cut over those with ``top_p`` < 1 and one softmax, then each row draws from its
    own generator (so a seeded row draws what it draws alone), and one host copy for all.
    The same operations as ``choose``, row-wise: the probabilities come out bit for bit the
    same, and so do the draws. A row whose draw fails (no token left to draw: every logit
    masked) gets the exception in place of its token; the others draw on.
    """
    tokens: list[int | Exception] = [0] * len(params)
    greedy = [i for i, p in enumerate(params) if p.temperature < GREEDY_BELOW]
    sampled = [i for i, p in enumerate(params) if p.temperature >= GREEDY_BELOW]
    device = logits.device
    if greedy:
        picked = _rows(logits, greedy).argmax(dim=-1).tolist()
        for i, token in zip(greedy, picked, strict=True):
            tokens[i] = token
    if not sampled:
        return tokens
    temperatures = torch.tensor([params[i].temperature for i in sampled], dtype=logits.dtype, device=device)
    scaled = _rows(logits, sampled) / temperatures.unsqueeze(1)
    cut = [j for j, i in enumerate(sampled) if params[i].top_p < 1.0]
    if cut:
        part = _rows(scaled, cut)
        sorted_logits, order = torch.sort(part, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        top_p = torch.tensor([params[sampled[j]].top_p for j in cut], dtype=cumulative.dtype, device=device)
        drop = cumulative > top_p.unsqueeze(1)
        drop[:, 1:] = drop[:, :-1].clone()
        drop[:, 0] = False  # always keep the most likely token
        part = part.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
        if len(cut) == len(sampled):
            scaled = part
        else:
            scaled[torch.tensor(cut, device=device)] = part
    probs = torch.softmax(scaled, dim=-1)
    draws = {}
    for j, i in enumerate(sampled):
        try:
            draws[i] = torch.multinomial(probs[j], 1, generator=generators[i])
        except RuntimeError as exc:
            tokens[i] = exc
    if draws:
        for i, token in zip(draws, torch.cat(list(draws.values())).tolist(), strict=True):
            tokens[i] = token
    return tokens


def _rows(tensor: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """Rows ``rows`` of ``tensor`` (the tensor itself when that is all of them)."""
    if len(rows) == tensor.shape[0]:
        return tensor
    return tensor.index_select(0, torch.tensor(rows, device=tensor.device))
