"""The engine as registered, and model files described without loading them.

Imports nothing heavy: discovering the plugin and listing models never loads
llama.cpp.
"""

from __future__ import annotations

from pathlib import Path

from millm_host.api import EMBEDDINGS, LOGPROBS, STEERING_VECTORS, EngineSpec, ModelDescriptor, split_gguf_name

from .settings import SETTINGS

ENGINE_NAME = "gguf"

SPEC = EngineSpec(
    name=ENGINE_NAME,
    factory="millm_engine_gguf.process:ProcessEngine",
    describe="millm_engine_gguf.spec:describe",
    formats=frozenset({"gguf"}),
    # GGUF_ENABLE_EMBEDDINGS=false turns embeddings off
    capabilities=frozenset({EMBEDDINGS, LOGPROBS, STEERING_VECTORS}),
    settings=SETTINGS,
)

_MAGIC = b"GGUF"


def describe(path: str) -> ModelDescriptor | None:
    """A .gguf file as ``repo:QUANT`` (``SmolLM2-135M-Instruct:Q4_1``); None for anything else.

    The quantization tag comes from the file name; a file whose name carries
    none is served under its bare name. Only the 4-byte magic is read.
    """
    p = Path(path)
    if not (p.is_file() and p.suffix == ".gguf" and _is_gguf(p)):
        return None
    repo, quant = split_gguf_name(p)
    if quant is None:
        return ModelDescriptor(id=repo, path=str(p), format="gguf", engine=ENGINE_NAME)
    return ModelDescriptor(
        id=f"{repo}:{quant}", path=str(p), format="gguf", engine=ENGINE_NAME, quantization=quant, repo=repo
    )


def _is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(_MAGIC)) == _MAGIC
    except OSError:
        return False
