"""The SAE encoder a k-sparse probe reads its features through (SAELens layout).

Probes load their own copy from ``PROBE_SAE_DIR/<sae_id>/``: a probe's score must
not depend on what another plugin has attached or how it steers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from millm_host.errors import MillmError
from millm_host.paths import confined_path, plain_name

ARCHITECTURES = ("standard", "jumprelu", "topk")


class SaeUnavailable(Exception):
    """The SAE cannot be found or read; the probe's results say ``encoder_failed``."""


@dataclass
class Encoder:
    """``encode(x)[features]`` for a set of feature indices, on one device."""

    sae_id: str
    architecture: str
    d_in: int
    d_sae: int
    k: int | None
    apply_b_dec: bool
    w_enc: Any  # [d_in, d_sae] (topk) or [d_in, n_features]
    b_enc: Any
    b_dec: Any
    threshold: Any
    features: Any  # indices into the encoded vector

    def encode(self, x: Any) -> Any:
        """``[rows, d_in]`` residuals → ``[rows, n_features]`` feature activations (float32)."""
        import torch

        x = x.float()
        if self.apply_b_dec:
            x = x - self.b_dec
        pre = x @ self.w_enc + self.b_enc
        if self.architecture == "standard":
            return torch.relu(pre)
        if self.architecture == "jumprelu":
            return pre * (pre > self.threshold)
        acts = torch.relu(pre)
        k = min(self.k or acts.shape[-1], acts.shape[-1])
        top = torch.topk(acts, k, dim=-1)
        kept = torch.zeros_like(acts).scatter(-1, top.indices, top.values)
        return kept[:, self.features]


def sae_folder(sae_dir: str, sae_id: str) -> Path:
    """``<sae_dir>/<sae_id>``, which must stay inside ``sae_dir`` (no ``..``, no absolute id, no link out)."""
    try:
        return confined_path(plain_name(sae_id, "sae.sae_id"), [Path(sae_dir)], param="sae.sae_id",
                             setting="PROBE_SAE_DIR")
    except MillmError as exc:
        raise SaeUnavailable(f"SAE {sae_id!r}: {exc.message}") from None


def load_encoder(sae_dir: str | None, sae_id: str, features: list[int], d_model: int, device: Any) -> Encoder:
    """Read ``<sae_dir>/<sae_id>`` and keep what encoding ``features`` needs, on ``device``."""
    import torch
    from safetensors.torch import load_file

    if not sae_dir:
        raise SaeUnavailable(f"SAE {sae_id!r}: PROBE_SAE_DIR is not set")
    folder = sae_folder(sae_dir, sae_id)
    try:
        cfg = json.loads((folder / "cfg.json").read_text())
        tensors = load_file(str(folder / "sae_weights.safetensors"))
    except (OSError, ValueError) as exc:
        raise SaeUnavailable(f"SAE {sae_id!r} cannot be read from {folder}: {exc}") from None
    architecture = cfg.get("architecture", "standard")
    d_in, d_sae = int(cfg["d_in"]), int(cfg["d_sae"])
    if architecture not in ARCHITECTURES:
        raise SaeUnavailable(f"SAE {sae_id!r}: unknown architecture {architecture!r}")
    if d_in != d_model:
        raise SaeUnavailable(f"SAE {sae_id!r} reads width {d_in}; the model's residual is {d_model}")
    if architecture == "jumprelu" and "threshold" not in tensors:
        raise SaeUnavailable(f"SAE {sae_id!r} is jumprelu but carries no threshold")
    if max(features) >= d_sae:
        raise SaeUnavailable(f"SAE {sae_id!r} has {d_sae} features; index {max(features)} does not exist")

    def take(name: str) -> Any:
        return tensors[name].to(device=device, dtype=torch.float32) if name in tensors else None

    index = torch.tensor(features, dtype=torch.long, device=device)
    w_enc, b_enc, threshold = take("W_enc"), take("b_enc"), take("threshold")
    if architecture != "topk":  # elementwise activations: only the selected columns are needed
        w_enc, b_enc = w_enc[:, index], b_enc[index]
        threshold = threshold[index] if threshold is not None else None
    return Encoder(
        sae_id=sae_id, architecture=architecture, d_in=d_in, d_sae=d_sae, k=cfg.get("k"),
        apply_b_dec=bool(cfg.get("apply_b_dec_to_input", False)), w_enc=w_enc, b_enc=b_enc,
        b_dec=take("b_dec"), threshold=threshold, features=index,
    )
