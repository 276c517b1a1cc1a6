"""SAELens SAE directories for millm plugins: one reader and one encoder, shared.

A library, not a plugin (it registers no hooks): the steering plugin attaches
SAEs and reads their activations, the probes plugin encodes the features its
k-sparse probes read, and both read the same ``cfg.json`` and
``sae_weights.safetensors`` through this package, for the same architectures
(``standard``, ``jumprelu``, ``topk``).

``millm_saelens.config`` reads and checks a directory without torch;
``millm_saelens.weights`` (torch) loads the tensors and encodes.
"""

from .config import (
    ARCHITECTURES,
    CONFIG_FILE,
    WEIGHTS_FILE,
    SAEConfig,
    SAEUnreadable,
    check_weights,
    describe,
    expected_shapes,
    read_config,
)

__all__ = [
    "ARCHITECTURES",
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "SAEConfig",
    "SAEUnreadable",
    "check_weights",
    "describe",
    "expected_shapes",
    "read_config",
]
