"""Reading a SAELens SAE directory without loading its weights (no torch).

``<dir>/cfg.json`` and ``<dir>/sae_weights.safetensors``; the tensor shapes are
checked from the safetensors header, so registering a 16k-wide SAE reads a few
kilobytes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from millm_host.api import MillmError

CONFIG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
ARCHITECTURES = ("standard", "jumprelu", "topk")
HOOK_NAME = re.compile(r"^blocks\.(?P<layer>0|[1-9]\d*)\.hook_resid_(?P<point>pre|post)$")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class SAEUnreadable(MillmError):
    """The directory is not a SAELens SAE this server can use."""

    status, code = 400, "sae_unreadable"


@dataclass(frozen=True)
class SAEConfig:
    """What ``cfg.json`` says, checked. ``point`` is ``resid_pre`` or ``resid_post``; ``raw`` is the
    parsed file, stored whole at registration."""

    d_in: int
    d_sae: int
    layer: int
    point: str
    architecture: str
    k: int | None
    apply_b_dec_to_input: bool
    model_name: str | None
    dtype: str | None
    hook_name: str
    raw: dict[str, Any] = field(compare=False, repr=False)


def _positive_int(cfg: dict[str, Any], key: str) -> int:
    value = cfg.get(key)
    if not _is_int(value) or value < 1:
        raise SAEUnreadable(f"{CONFIG_FILE}: {key} must be a positive integer, not {value!r}", param="path")
    return value


def read_config(directory: Path) -> SAEConfig:
    """Parse and check ``cfg.json``; 400 ``sae_unreadable`` naming what is wrong."""
    path = directory / CONFIG_FILE
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SAEUnreadable(f"{directory} has no {CONFIG_FILE}", param="path") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SAEUnreadable(f"{path} cannot be read as JSON: {exc}", param="path") from None
    if not isinstance(cfg, dict):
        raise SAEUnreadable(f"{path} must hold a JSON object", param="path")
    d_in, d_sae = _positive_int(cfg, "d_in"), _positive_int(cfg, "d_sae")
    hook_name = cfg.get("hook_name")
    if not isinstance(hook_name, str) or (match := HOOK_NAME.match(hook_name)) is None:
        raise SAEUnreadable(
            f"{CONFIG_FILE}: hook_name {hook_name!r} is not blocks.<N>.hook_resid_post or blocks.<N>.hook_resid_pre",
            param="path",
        )
    architecture = cfg.get("architecture", "standard")
    if architecture not in ARCHITECTURES:
        raise SAEUnreadable(
            f"{CONFIG_FILE}: architecture {architecture!r} is not one of {', '.join(ARCHITECTURES)}", param="path"
        )
    k = None
    if architecture == "topk":
        k = _positive_int(cfg, "k")
        if k > d_sae:
            raise SAEUnreadable(f"{CONFIG_FILE}: k ({k}) is larger than d_sae ({d_sae})", param="path")
    apply_b_dec = cfg.get("apply_b_dec_to_input", False)
    if not isinstance(apply_b_dec, bool):
        raise SAEUnreadable(f"{CONFIG_FILE}: apply_b_dec_to_input must be a boolean", param="path")
    return SAEConfig(
        d_in=d_in,
        d_sae=d_sae,
        layer=int(match["layer"]),
        point=f"resid_{match['point']}",
        architecture=architecture,
        k=k,
        apply_b_dec_to_input=apply_b_dec,
        model_name=cfg.get("model_name") if isinstance(cfg.get("model_name"), str) else None,
        dtype=cfg.get("dtype") if isinstance(cfg.get("dtype"), str) else None,
        hook_name=hook_name,
        raw=cfg,
    )


def expected_shapes(cfg: SAEConfig) -> dict[str, list[int]]:
    shapes = {
        "W_enc": [cfg.d_in, cfg.d_sae],
        "b_enc": [cfg.d_sae],
        "W_dec": [cfg.d_sae, cfg.d_in],
        "b_dec": [cfg.d_in],
    }
    if cfg.architecture == "jumprelu":
        shapes["threshold"] = [cfg.d_sae]
    return shapes


def check_weights(directory: Path, cfg: SAEConfig) -> None:
    """Every tensor the architecture needs is present with the shape ``cfg.json`` implies."""
    from safetensors import safe_open

    path = directory / WEIGHTS_FILE
    if not path.is_file():
        raise SAEUnreadable(f"{directory} has no {WEIGHTS_FILE}", param="path")
    try:
        with safe_open(str(path), framework="numpy") as weights:
            present = set(weights.keys())
            for name, shape in expected_shapes(cfg).items():
                if name not in present:
                    raise SAEUnreadable(f"{WEIGHTS_FILE} has no tensor {name}", param="path")
                found = list(weights.get_slice(name).get_shape())
                if found != shape:
                    raise SAEUnreadable(
                        f"{WEIGHTS_FILE}: {name} has shape {found}; cfg.json implies {shape}", param="path"
                    )
    except SAEUnreadable:
        raise
    except Exception as exc:  # a truncated or foreign file: safetensors raises its own errors
        raise SAEUnreadable(f"{path} cannot be read: {type(exc).__name__}: {exc}", param="path") from None


def describe(directory: Path) -> SAEConfig:
    """Read and check a SAE directory (config and tensor shapes)."""
    if not directory.is_dir():
        raise SAEUnreadable(f"{directory} is not a directory", param="path")
    cfg = read_config(directory)
    check_weights(directory, cfg)
    return cfg
