"""The settings the GGUF engine reads (environment variables)."""

from __future__ import annotations

from millm_host.api import Setting

SETTINGS = (
    Setting(
        "GGUF_N_CTX",
        int,
        4096,
        "Context window GGUF models are loaded with, capped at the model's trained length (0: the trained length)",
    ),
    Setting(
        "GGUF_N_BATCH",
        int,
        512,
        "llama.cpp batch size: prompt tokens per decode call, and the longest input an embedding accepts",
    ),
    Setting("GGUF_N_THREADS", int, 0, "Threads llama.cpp generates with (0: llama.cpp's default, half the cores)"),
    Setting(
        "GGUF_N_THREADS_BATCH", int, 0, "Threads llama.cpp reads prompts with (0: llama.cpp's default, every core)"
    ),
    Setting("GGUF_N_GPU_LAYERS", int, 0, "Layers offloaded to the GPU on a GPU build of llama.cpp (-1: all)"),
    Setting(
        "GGUF_PARALLEL",
        int,
        4,
        "Generations llama.cpp decodes together, each a sequence of one context with a KV cache of GGUF_N_CTX "
        "tokens (4, as llama-server's automatic --parallel; 1: one at a time, one KV cache; steering runs alone)",
    ),
    Setting(
        "GGUF_FLASH_ATTN",
        bool,
        True,
        "llama.cpp's flash attention for generation, as llama-server's default resolves on a CPU (about 15% "
        "faster on the default model; false: the separate attention kernels, llama-cpp-python's default)",
    ),
    Setting(
        "GGUF_PROFILE",
        str,
        "",
        "A file the engine process writes its time per part as JSON to whenever it is idle (decode, sampling, "
        "frames; bench/gguf_vs_llama_server.py reads it); empty: none is kept",
    ),
    Setting(
        "GGUF_ENABLE_EMBEDDINGS",
        bool,
        True,
        "Load each GGUF model with a mean-pooling embedding context beside it (false: /v1/embeddings is refused)",
    ),
)
