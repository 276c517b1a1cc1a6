"""The engine as registered: describing model files imports no torch."""

from __future__ import annotations

import json
import re
from pathlib import Path

from millm_host.api import (
    EMBEDDINGS,
    LAYER_HOOKS,
    LOGITS_PROCESSORS,
    LOGPROBS,
    LORA_ADAPTERS,
    SCORING,
    EngineSpec,
    ModelDescriptor,
    Setting,
    split_gguf_name,
)

ENGINE_NAME = "transformers"

#: The engine's own settings (declared by the host when the engine registers).
SETTINGS = (
    Setting("MILLM_DTYPE", str, "auto", "Weights dtype for the transformers engine (auto = float32 on CPU)"),
    Setting("MILLM_DEVICE", str, "auto", "Device for the transformers engine (auto, cpu, cuda, cuda:N)"),
    Setting(
        "SCORING_FLOAT32_DEVICE",
        str,
        "auto",
        "Where a float32 scoring copy goes: auto (the model's GPU if it fits, then the CPU), cpu, cuda or cuda:N",
    ),
    Setting(
        "SCORING_FLOAT32_HEADROOM_MB", int, 1024, "Memory (MiB) a float32 scoring copy must leave free on its device"
    ),
    Setting(
        "MILLM_BATCHING",
        str,
        "continuous",
        "Generation backend: continuous (generations share decode steps) or serial (one at a time)",
    ),
    Setting("MILLM_BATCH_MAX_ROWS", int, 8, "Continuous batching: the most generations decoding at once"),
    Setting(
        "MILLM_CPU_SMALL_BATCH_TUNING",
        bool,
        True,
        "On the CPU in float32: time each weight's product for a few rows both ways at load and keep the faster",
    ),
    Setting(
        "MILLM_PREFILL_CHUNK",
        int,
        256,
        "Continuous batching: prompt tokens prefilled between two decode steps (shared by the prefills under way)",
    ),
    Setting(
        "MILLM_PREFIX_CACHE_MB",
        int,
        256,
        "Continuous batching: memory (MiB) for prompts kept for reuse by later requests (0: no prefix caching)",
    ),
    Setting(
        "MILLM_BATCH_GATHER_MS",
        int,
        0,
        "Continuous batching: how long a first arrival waits for others to share its prefill (0: it starts at once)",
    ),
)

SPEC = EngineSpec(
    name=ENGINE_NAME,
    factory="millm_engine_transformers.engine:TransformersEngine",
    describe="millm_engine_transformers.spec:describe",
    formats=frozenset({"hf", "gguf"}),
    capabilities=frozenset({LAYER_HOOKS, LOGITS_PROCESSORS, LOGPROBS, SCORING, EMBEDDINGS, LORA_ADAPTERS}),
    memory_estimate="millm_engine_transformers.spec:memory_estimate",
    settings=SETTINGS,
    preference=1,  # the reference engine: it serves .gguf files too unless MILLM_ENGINE names another
)

_HF_CACHE_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]{7,40})/?$")


def describe(path: str) -> ModelDescriptor | None:
    """A checkpoint directory or .gguf file as this engine would serve it."""
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        repo, quant = split_gguf_name(p)
        return ModelDescriptor(id=repo, path=str(p), format="gguf", engine=ENGINE_NAME, quantization=quant, repo=None)
    if p.is_dir() and (p / "config.json").is_file():
        hf_id = revision = None
        match = _HF_CACHE_SNAPSHOT.search(str(p.resolve()))
        if match:
            hf_id, revision = f"{match['org']}/{match['name']}", match["rev"]
        quant = None
        try:
            config = json.loads((p / "config.json").read_text())
            qc = config.get("quantization_config") or {}
            quant = qc.get("quant_method") or _dtype_label(config.get("torch_dtype") or config.get("dtype"))
        except (OSError, ValueError):
            pass
        name = hf_id.split("/")[-1] if hf_id else p.name
        return ModelDescriptor(
            id=name, path=str(p), format="hf", engine=ENGINE_NAME, hf_id=hf_id, revision=revision, quantization=quant
        )
    return None


def memory_estimate(descriptor: ModelDescriptor, disk_bytes: int) -> int:
    """A .gguf file is dequantized to float32 (about 8 times its size on disk); a checkpoint takes its size."""
    return disk_bytes * 8 if descriptor.format == "gguf" else disk_bytes


def _dtype_label(dtype: str | None) -> str | None:
    return {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}.get(dtype or "")
