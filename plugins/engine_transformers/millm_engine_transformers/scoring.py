"""Next-token log-probabilities from one forward pass (the math of scoring mode)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import transformers

from millm_host.api import NextTokenScores, NonFiniteLogits, PromptTokenScores, ScoringParams, TokenLogprob


@torch.inference_mode()
def last_logits(model: Any, ids: Sequence[int], device: torch.device) -> torch.Tensor:
    """The next-token logits after ``ids``, as float32 (no cache, nothing generated)."""
    return _logits(model, ids, device, keep=1)[-1]


def _logits(model: Any, ids: Sequence[int], device: torch.device, keep: int) -> torch.Tensor:
    """One pass over ``ids``, no cache: the last ``keep`` positions' logits (0: all), as float32."""
    output = model(input_ids=torch.tensor([list(ids)], device=device), use_cache=False, logits_to_keep=keep)
    return output.logits[0].float()


#: Prompt positions whose logits a prompt's own scoring holds at once: 512 x the vocabulary's floats
#: (100 MB at SmolLM2's 49,152), whatever the prompt's length (a whole 8,192-token prompt's would be 1.6 GB).
PROMPT_CHUNK = 512


@torch.inference_mode()
def prompt_scores(
    model: Any,
    ids: Sequence[int],
    device: torch.device,
    top: int,
    index: int,
    cache_arg: str,
    chunk: int = PROMPT_CHUNK,
) -> list[PromptTokenScores]:
    """Each of ``ids[1:]`` scored by the model after the tokens before it (``echo``, ``prompt_logprobs``): the
    log-softmax of that row, as ``next_token_scores`` normalises a row with no temperature and no allowed set.

    The prompt runs in chunks of ``chunk`` positions on a KV cache, so memory holds one chunk's logits, not
    the whole prompt's; a prompt of at most ``chunk`` tokens is the one pass scoring makes.
    """
    cache = transformers.DynamicCache()
    scores: list[PromptTokenScores] = []
    for start in range(0, len(ids) - 1, chunk):
        piece = list(ids[start : start + chunk])
        output = model(input_ids=torch.tensor([piece], device=device), use_cache=True, **{cache_arg: cache})
        targets = list(ids[start + 1 : start + 1 + len(piece)])
        scores += _scored_rows(output.logits[0, : len(targets)].float(), targets, top, index, start)
    return scores


def _scored_rows(rows: torch.Tensor, targets: list[int], top: int, index: int, offset: int) -> list[PromptTokenScores]:
    """``targets[i]`` scored by ``rows[i]`` (the logits after prompt token ``offset + i``)."""
    invalid = torch.isnan(rows) | torch.isposinf(rows)
    if bool(invalid.any()):
        position, token = (int(v) for v in invalid.nonzero()[0])
        raise NonFiniteLogits(
            f"the logit of token {token} after prompt token {offset + position} is {float(rows[position, token])}",
            index=index,
        )
    logprobs = torch.log_softmax(rows, dim=-1)
    chosen = logprobs.gather(1, torch.tensor(targets, device=rows.device).unsqueeze(1)).squeeze(1)
    ranks = (logprobs > chosen.unsqueeze(1)).sum(dim=1) + 1
    values, best = logprobs.topk(min(top, logprobs.shape[-1]), dim=-1)
    alternatives = zip(best.tolist(), values.tolist(), strict=True)
    return [
        PromptTokenScores(
            TokenLogprob(int(token), logprob), int(rank), [TokenLogprob(t, v) for t, v in zip(*row, strict=True)]
        )
        for token, logprob, rank, row in zip(targets, chosen.tolist(), ranks.tolist(), alternatives, strict=True)
    ]


def next_token_scores(logits: torch.Tensor, params: ScoringParams, index: int) -> NextTokenScores:
    """Normalise ``logits`` (1-D float32) over the candidates and pick the answer.

    Temperature divides the logits (0: no scaling). With ``allowed_token_ids`` the
    candidates are that set and the log-probabilities are normalised over it only.
    NaN or +inf on a candidate, or a reported token whose logit is -inf, is refused:
    a -inf outside the candidates is fine (some heads mask padded vocabulary so).
    Ties are broken by the lower token id, so the answer is deterministic.
    """
    if params.temperature > 0:
        logits = logits / params.temperature
    if params.allowed_token_ids is not None:
        ids = torch.tensor(params.allowed_token_ids, device=logits.device)
        candidates = logits[ids]
    else:
        ids = None
        candidates = logits
    invalid = torch.isnan(candidates) | torch.isposinf(candidates)
    if bool(invalid.any()):
        position = int(invalid.nonzero()[0])
        token = int(ids[position]) if ids is not None else position
        raise NonFiniteLogits(f"the logit of token {token} is {float(candidates[position])}", index=index)
    logprobs = torch.log_softmax(candidates, dim=-1)
    count = max(1, min(params.top, candidates.numel()))
    order = torch.sort(candidates, descending=True, stable=True).indices[:count]
    reported = []
    for position in order.tolist():
        token = int(ids[position]) if ids is not None else position
        if torch.isneginf(candidates[position]):
            raise NonFiniteLogits(f"the logit of reported token {token} is -inf", index=index)
        reported.append(TokenLogprob(token, float(logprobs[position])))
    return NextTokenScores(chosen=reported[0], top=reported[: min(params.top, candidates.numel())])
