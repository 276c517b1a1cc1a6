"""Next-token log-probabilities from one forward pass (the math of scoring mode)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from millm_host.api import NextTokenScores, NonFiniteLogits, ScoringParams, TokenLogprob


@torch.inference_mode()
def last_logits(model: Any, ids: Sequence[int], device: torch.device) -> torch.Tensor:
    """The next-token logits after ``ids``, as float32 (no cache, nothing generated)."""
    output = model(input_ids=torch.tensor([list(ids)], device=device), use_cache=False, logits_to_keep=1)
    return output.logits[0, -1].float()


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
