"""The SAE encoder a k-sparse probe reads its features through (SAELens layout, ``millm_saelens``).

Probes load their own copy from ``PROBE_SAE_DIR/<sae_id>/``: a probe's score must
not depend on what another plugin has attached or how it steers.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from millm_host.api import MillmError, confined_path, plain_name
from millm_saelens import SAEUnreadable, read_config

if TYPE_CHECKING:
    from millm_saelens.weights import FeatureEncoder


class SaeUnavailable(Exception):
    """The SAE cannot be found or read; the probe's results say ``encoder_failed``."""


def sae_folder(sae_dir: str, sae_id: str) -> Path:
    """``<sae_dir>/<sae_id>``, which must stay inside ``sae_dir`` (no ``..``, no absolute id, no link out)."""
    try:
        return confined_path(
            plain_name(sae_id, "sae.sae_id"), [Path(sae_dir)], param="sae.sae_id", setting="PROBE_SAE_DIR"
        )
    except MillmError as exc:
        raise SaeUnavailable(f"SAE {sae_id!r}: {exc.message}") from None


def load_encoder(sae_dir: str | None, sae_id: str, features: list[int], d_model: int, device: Any) -> FeatureEncoder:
    """Read ``<sae_dir>/<sae_id>`` and keep what encoding ``features`` needs, on ``device``."""
    from millm_saelens.weights import load  # torch: only when a sparse probe compiles

    if not sae_dir:
        raise SaeUnavailable(f"SAE {sae_id!r}: PROBE_SAE_DIR is not set")
    folder = sae_folder(sae_dir, sae_id)
    try:
        cfg = read_config(folder)
        if cfg.d_in != d_model:
            raise SaeUnavailable(f"SAE {sae_id!r} reads width {cfg.d_in}; the model's residual is {d_model}")
        if max(features) >= cfg.d_sae:
            raise SaeUnavailable(f"SAE {sae_id!r} has {cfg.d_sae} features; index {max(features)} does not exist")
        sae = load(folder, cfg, device)
    except SAEUnreadable as exc:
        raise SaeUnavailable(f"SAE {sae_id!r} cannot be read from {folder}: {exc.message}") from None
    return sae.encoder(features)
