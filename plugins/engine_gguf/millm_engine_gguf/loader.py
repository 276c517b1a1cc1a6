"""Loading a .gguf file into llama.cpp with the GGUF_* settings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import llama_cpp
from llama_cpp._internals import LlamaModel


@dataclass(frozen=True)
class LoadOptions:
    """How a model is loaded, read once from the settings."""

    n_ctx: int
    n_batch: int
    n_threads: int | None
    n_threads_batch: int | None
    n_gpu_layers: int
    embeddings: bool
    parallel: int = 4  # generations decoded together (1: one at a time)
    profile: str = ""  # where the child writes where its time went (GGUF_PROFILE; empty: nowhere)
    flash_attn: bool = True  # llama.cpp's flash attention kernel (GGUF_FLASH_ATTN), as llama-server's default

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> LoadOptions:
        n_ctx, n_batch = settings["GGUF_N_CTX"], settings["GGUF_N_BATCH"]
        if n_ctx < 0 or n_batch < 1:
            raise ValueError(f"GGUF_N_CTX must be 0 or more and GGUF_N_BATCH 1 or more (got {n_ctx}, {n_batch})")
        return cls(
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_threads=settings["GGUF_N_THREADS"] or None,
            n_threads_batch=settings["GGUF_N_THREADS_BATCH"] or None,
            n_gpu_layers=settings["GGUF_N_GPU_LAYERS"],
            embeddings=settings["GGUF_ENABLE_EMBEDDINGS"],
            parallel=_parallel(settings),
            profile=settings.get("GGUF_PROFILE", ""),
            flash_attn=settings.get("GGUF_FLASH_ATTN", True),
        )


def _parallel(settings: Mapping[str, Any]) -> int:
    parallel = settings.get("GGUF_PARALLEL", 4)
    if parallel < 1:
        raise ValueError(f"GGUF_PARALLEL must be 1 or more (got {parallel})")
    return parallel


def load_llama(path: str, options: LoadOptions, progress: Callable[[str], None]) -> llama_cpp.Llama:
    """A ``Llama`` whose context window is ``GGUF_N_CTX`` capped at the trained length."""
    progress(f"loading {path} into llama.cpp (n_ctx {options.n_ctx or 'trained'}, n_batch {options.n_batch})")
    llm = _llama(path, options, options.n_ctx)
    trained = llama_cpp.llama_model_n_ctx_train(llm.model)
    if options.n_ctx and 0 < trained < options.n_ctx:
        progress(f"the model was trained on {trained} tokens; reloading with that context window")
        llm.close()
        llm = _llama(path, options, trained)
    # OpenAI's frequency and presence penalties count every generated token, not
    # llama.cpp's default last 64.
    llm.last_n_tokens_size = llm.n_ctx()
    return llm


def load_vocabulary(path: str) -> LlamaModel:
    """The file's vocabulary and metadata only (no weights, no context): what tokenizing needs."""
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    return LlamaModel(path_model=path, params=params, verbose=False)


def _llama(path: str, options: LoadOptions, n_ctx: int) -> llama_cpp.Llama:
    return llama_cpp.Llama(
        model_path=path,
        n_ctx=n_ctx,
        n_batch=options.n_batch,
        n_ubatch=options.n_batch,
        n_threads=options.n_threads,
        n_threads_batch=options.n_threads_batch,
        n_gpu_layers=options.n_gpu_layers,
        flash_attn=options.flash_attn,
        verbose=False,
    )
