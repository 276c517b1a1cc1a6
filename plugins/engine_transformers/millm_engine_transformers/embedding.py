"""Embedding vectors: the last hidden layer pooled, computed with no layer hook installed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

POOLINGS = ("mean", "last", "cls")


@torch.inference_mode()
def pooled_last_hidden(model: Any, ids: Sequence[int], device: torch.device, pooling: str) -> list[float]:
    """``mean`` averages every position, ``last`` takes the last, ``cls`` the first (float32)."""
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}")
    # The base model's output is the last hidden layer after the final norm; no LM head runs.
    hidden = model.base_model(input_ids=torch.tensor([list(ids)], device=device), use_cache=False).last_hidden_state
    hidden = hidden[0].float()
    if pooling == "mean":
        vector = hidden.mean(dim=0)
    elif pooling == "last":
        vector = hidden[-1]
    else:
        vector = hidden[0]
    return vector.tolist()
