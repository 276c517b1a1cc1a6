"""A SAE's weights on the model's device: encoding and steering vectors (torch).

Weights are kept in float32 whatever the file stores: encoding reads the
residual in float32, and a steering vector is summed in float32 before it is
cast once to the model's dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file

from .saelens import WEIGHTS_FILE, SAEConfig, SAEUnreadable, expected_shapes


class LoadedSAE:
    """``W_enc [d_in, d_sae]``, ``b_enc``, ``W_dec [d_sae, d_in]``, ``b_dec`` (and ``threshold``) on a device."""

    def __init__(self, sae_id: str, cfg: SAEConfig, tensors: Mapping[str, torch.Tensor]) -> None:
        self.sae_id = sae_id
        self.cfg = cfg
        self.W_enc = tensors["W_enc"]
        self.b_enc = tensors["b_enc"]
        self.W_dec = tensors["W_dec"]
        self.b_dec = tensors["b_dec"]
        self.threshold = tensors.get("threshold")

    @property
    def device(self) -> torch.device:
        return self.W_dec.device

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations ``[..., d_sae]`` of residual rows ``x [..., d_in]`` (float32)."""
        x = x.to(device=self.device, dtype=torch.float32)
        if self.cfg.apply_b_dec_to_input:
            x = x - self.b_dec
        pre = x @ self.W_enc + self.b_enc
        if self.cfg.architecture == "jumprelu":
            return pre * (pre > self.threshold)
        acts = torch.relu(pre)
        if self.cfg.architecture == "topk":
            top = torch.topk(acts, self.cfg.k, dim=-1)
            acts = torch.zeros_like(acts).scatter(-1, top.indices, top.values)
        return acts

    def top_features(
        self, rows: torch.Tensor, candidates: torch.Tensor | None, k: int
    ) -> list[list[tuple[int, float]]]:
        """Per row, the ``k`` largest activations among ``candidates`` (all features when None),
        as ``(index, value)`` pairs in descending order, inactive (zero) features left out."""
        acts = self.encode(rows)
        if candidates is not None:
            acts = acts.index_select(-1, candidates)
        top = torch.topk(acts, min(k, acts.shape[-1]), dim=-1)
        indices = candidates[top.indices] if candidates is not None else top.indices
        return [
            [(i, v) for i, v in zip(row_indices, row_values, strict=False) if v != 0.0]
            for row_indices, row_values in zip(indices.tolist(), top.values.tolist(), strict=False)
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
    try:
        raw = load_file(str(directory / WEIGHTS_FILE), device="cpu")
    except Exception as exc:
        raise SAEUnreadable(f"{directory / WEIGHTS_FILE} cannot be read: {type(exc).__name__}: {exc}") from None
    tensors = {}
    for name, shape in expected_shapes(cfg).items():
        tensor = raw.get(name)
        if tensor is None or list(tensor.shape) != shape:
            raise SAEUnreadable(f"{directory / WEIGHTS_FILE}: {name} is missing or changed shape since registration")
        tensors[name] = tensor.to(device=device, dtype=torch.float32).contiguous()
    return LoadedSAE(sae_id, cfg, tensors)
