"""Writing SAELens directories for tests and benchmarks (numpy; nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from .config import CONFIG_FILE, WEIGHTS_FILE


def write_sae(
    directory: Path,
    *,
    d_in: int,
    d_sae: int,
    layer: int,
    point: str = "post",
    architecture: str = "standard",
    seed: int = 0,
    tensors: dict[str, np.ndarray] | None = None,
    **cfg: Any,
) -> Path:
    """A SAE directory with random float32 weights (``tensors`` replaces any of them).

    ``W_dec`` rows have unit norm, as trained SAEs' usually do.
    """
    rng = np.random.default_rng(seed)
    w_dec = rng.standard_normal((d_sae, d_in)).astype(np.float32)
    w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)
    weights = {
        "W_enc": rng.standard_normal((d_in, d_sae)).astype(np.float32) / np.sqrt(d_in),
        "b_enc": (rng.standard_normal(d_sae) * 0.1).astype(np.float32),
        "W_dec": w_dec,
        "b_dec": (rng.standard_normal(d_in) * 0.1).astype(np.float32),
    }
    if architecture == "jumprelu":
        weights["threshold"] = np.abs(rng.standard_normal(d_sae) * 0.1).astype(np.float32)
    weights.update(tensors or {})
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(directory / WEIGHTS_FILE))
    config = {
        "d_in": d_in,
        "d_sae": d_sae,
        "hook_name": f"blocks.{layer}.hook_resid_{point}",
        "architecture": architecture,
        "dtype": "float32",
        "model_name": "test",
        **cfg,
    }
    (directory / CONFIG_FILE).write_text(json.dumps(config))
    return directory


def reference_encode(x: np.ndarray, w: dict[str, np.ndarray], cfg: dict[str, Any]) -> np.ndarray:
    """What an SAE's encoder gives for ``x``, in plain numpy (float64): the independent reference tests compare with."""
    if cfg.get("apply_b_dec_to_input"):
        x = x - w["b_dec"]
    pre = x @ w["W_enc"] + w["b_enc"]
    arch = cfg["architecture"]
    if arch == "jumprelu":
        return pre * (pre > w["threshold"])
    acts = np.maximum(pre, 0)
    if arch == "topk":
        keep = np.argsort(-acts, axis=-1)[:, : cfg["k"]]
        mask = np.zeros_like(acts, dtype=bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        acts = np.where(mask, acts, 0)
    return acts
