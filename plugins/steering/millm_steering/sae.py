"""An attached SAE (torch): the shared SAELens encoder, plus what steering reads and writes with it.

Weights are float32 on the model's device (``millm_saelens.weights``): encoding
reads the residual in float32, and a steering vector is summed in float32 before
it is cast once to the model's dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from millm_saelens import SAEConfig
from millm_saelens.weights import SAE, load_tensors


class LoadedSAE(SAE):
    """A registered SAE's weights, known by its ``sae_id``."""

    def __init__(self, sae_id: str, cfg: SAEConfig, tensors: Mapping[str, torch.Tensor]) -> None:
        super().__init__(cfg, dict(tensors))
        self.sae_id = sae_id

    def rank(self, rows: torch.Tensor, candidates: torch.Tensor | None, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, the ``k`` largest activations among ``candidates`` (all features when None):
        ``(values, feature indices)``, each ``[rows, k]`` in descending order, on the device."""
        acts = self.encode(rows)
        if candidates is not None:
            acts = acts.index_select(-1, candidates)
        top = torch.topk(acts, min(k, acts.shape[-1]), dim=-1)
        return top.values, candidates[top.indices] if candidates is not None else top.indices

    def top_features(
        self, rows: torch.Tensor, candidates: torch.Tensor | None, k: int
    ) -> list[list[tuple[int, float]]]:
        """``rank`` on the host: per row, ``(index, value)`` pairs, inactive (zero) features left out."""
        values, indices = self.rank(rows, candidates, k)
        return [
            [(i, v) for i, v in zip(row_indices, row_values, strict=False) if v != 0.0]
            for row_indices, row_values in zip(indices.tolist(), values.tolist(), strict=False)
        ]

    def candidates(self, features: list[int] | tuple[int, ...] | None) -> torch.Tensor | None:
        """The index tensor ``top_features`` takes for a feature restriction."""
        if features is None:
            return None
        return torch.tensor(list(features), dtype=torch.long, device=self.device)

    def steering_vector(self, values: Mapping[int, float], dtype: torch.dtype) -> torch.Tensor:
        """``Σ values[i] · W_dec[i]``: summed in float32, returned once in ``dtype``."""
        indices = torch.tensor(list(values), dtype=torch.long, device=self.device)
        strengths = torch.tensor(list(values.values()), dtype=torch.float32, device=self.device)
        return (strengths @ self.W_dec.index_select(0, indices)).to(dtype)


def model_dtype(name: str | None) -> torch.dtype:
    """The torch dtype of a model's ``ModelInfo.dtype`` name (float32 when unrecorded)."""
    dtype = getattr(torch, name or "float32", None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def load(sae_id: str, directory: Path, cfg: SAEConfig, device: str | torch.device) -> LoadedSAE:
    """Read the weights onto ``device`` (a torch device or its name, as ``ModelInfo.device``) in float32."""
    return LoadedSAE(sae_id, cfg, load_tensors(directory, cfg, device, since="registration"))
