"""A SAE's weights on a device, and encoding (torch).

Weights are kept in float32 whatever the file stores, and residuals are encoded
in float32: ``encode(x) = act(x' @ W_enc + b_enc)`` with ``x' = x - b_dec`` when
``apply_b_dec_to_input``, where ``act`` is ReLU (``standard``), ``pre * (pre >
threshold)`` (``jumprelu``) or ReLU keeping the ``k`` largest (``topk``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from .config import WEIGHTS_FILE, SAEConfig, SAEUnreadable, expected_shapes


class SAE:
    """``W_enc [d_in, d_sae]``, ``b_enc``, ``W_dec [d_sae, d_in]``, ``b_dec`` (and ``threshold``) on a device."""

    def __init__(self, cfg: SAEConfig, tensors: dict[str, torch.Tensor]) -> None:
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
        return _activate(self.cfg, self._pre(x, self.W_enc, self.b_enc), self.threshold)

    def _pre(self, x: torch.Tensor, w_enc: torch.Tensor, b_enc: torch.Tensor) -> torch.Tensor:
        x = x.to(device=self.device, dtype=torch.float32)
        if self.cfg.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ w_enc + b_enc

    def encoder(self, features: Sequence[int]) -> FeatureEncoder:
        """An encoder of ``features`` only (``encode(x)[..., features]``)."""
        return FeatureEncoder(self, features)


class FeatureEncoder:
    """``encode(x)[..., features]``, computing only the columns it needs.

    ``standard`` and ``jumprelu`` activations are elementwise, so only the chosen
    columns of ``W_enc`` are kept; ``topk`` needs every feature to find the ``k``
    largest, then keeps the chosen ones.
    """

    def __init__(self, sae: SAE, features: Sequence[int]) -> None:
        self.sae = sae
        self.features = torch.tensor(list(features), dtype=torch.long, device=sae.device)
        if sae.cfg.architecture == "topk":
            self.w_enc, self.b_enc, self.threshold = sae.W_enc, sae.b_enc, sae.threshold
        else:
            self.w_enc, self.b_enc = sae.W_enc[:, self.features], sae.b_enc[self.features]
            self.threshold = sae.threshold[self.features] if sae.threshold is not None else None

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """``[rows, d_in]`` residuals → ``[rows, n_features]`` feature activations (float32)."""
        acts = _activate(self.sae.cfg, self.sae._pre(x, self.w_enc, self.b_enc), self.threshold)
        return acts[..., self.features] if self.sae.cfg.architecture == "topk" else acts


def _activate(cfg: SAEConfig, pre: torch.Tensor, threshold: torch.Tensor | None) -> torch.Tensor:
    if cfg.architecture == "jumprelu":
        return pre * (pre > threshold)
    acts = torch.relu(pre)
    if cfg.architecture == "topk":
        assert cfg.k is not None
        top = torch.topk(acts, min(cfg.k, acts.shape[-1]), dim=-1)
        acts = torch.zeros_like(acts).scatter(-1, top.indices, top.values)
    return acts


def load_tensors(
    directory: Path, cfg: SAEConfig, device: str | torch.device, since: str = "cfg.json was read"
) -> dict[str, torch.Tensor]:
    """Every tensor ``cfg``'s architecture needs, checked against its shape, in float32 on ``device``.

    A tensor that is missing or whose shape is not the one ``cfg`` implies is refused
    as having changed ``since`` (when the caller read ``cfg``).
    """
    path = directory / WEIGHTS_FILE
    try:
        raw = load_file(str(path), device="cpu")
    except Exception as exc:
        raise SAEUnreadable(f"{path} cannot be read: {type(exc).__name__}: {exc}") from None
    tensors = {}
    for name, shape in expected_shapes(cfg).items():
        tensor = raw.get(name)
        if tensor is None or list(tensor.shape) != shape:
            raise SAEUnreadable(f"{path}: {name} is missing or changed shape since {since}")
        tensors[name] = tensor.to(device=device, dtype=torch.float32).contiguous()
    return tensors


def load(directory: Path, cfg: SAEConfig, device: str | torch.device) -> SAE:
    """Read the weights onto ``device`` (a torch device or its name, as ``ModelInfo.device``) in float32."""
    return SAE(cfg, load_tensors(directory, cfg, device))
