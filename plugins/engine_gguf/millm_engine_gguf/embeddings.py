"""A mean-pooling embedding context beside a loaded model.

llama.cpp fixes pooling when a context is created, and a generation context
cannot pool. So the engine keeps a second, small context on the same weights
(no second copy of the model), created with ``LLAMA_POOLING_TYPE_MEAN``: its
output is the mean over every input position of the last hidden layer (after
the final norm), as llama-cpp-python's own ``Llama.embed`` computes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp


class MeanPoolingContext:
    """Embeds one input of at most ``window`` tokens at a time."""

    def __init__(self, model: llama_cpp.llama_model_p, window: int, n_threads: int, n_threads_batch: int) -> None:
        params = llama_cpp.llama_context_default_params()
        # A pooled sequence must fit in one micro-batch, so the window is the batch.
        params.n_ctx = params.n_batch = params.n_ubatch = window
        params.n_seq_max = 1
        params.embeddings = True
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_MEAN
        # As llama-cpp-python's Llama creates its contexts: flash attention's
        # half-precision accumulation moves the vectors by about 1%.
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.n_threads = n_threads
        params.n_threads_batch = n_threads_batch
        self.n_embd = llama_cpp.llama_model_n_embd(model)
        self._ctx = llama_cpp.llama_init_from_model(model, params)
        if not self._ctx:
            raise RuntimeError("llama.cpp could not create the embedding context")
        self._batch = llama_cpp.llama_batch_init(window, 0, 1)

    def embed(self, ids: Sequence[int]) -> list[float]:
        """The mean-pooled vector of ``ids`` (1 to ``window`` tokens: ``GGUFEngine.embed`` checks)."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx), True)
        batch = self._batch
        batch.n_tokens = len(ids)
        for i, token in enumerate(ids):
            batch.token[i] = token
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True  # pooling reads every position
        code = llama_cpp.llama_decode(self._ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code} while embedding")
        pooled = llama_cpp.llama_get_embeddings_seq(self._ctx, 0)
        if not pooled:
            raise RuntimeError("llama.cpp returned no pooled embedding")
        return pooled[: self.n_embd]

    def close(self) -> None:
        """Free the context (before its model)."""
        if self._ctx:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
