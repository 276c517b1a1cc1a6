"""The GGUF engine in this process: a .gguf file resident in llama.cpp through llama-cpp-python.

The server does not use this class directly: ``ProcessEngine`` runs it in a child
process (``worker.py``), so a native crash cannot take the server down. Tests
and the child call it in-process.

llama.cpp exposes no module tree, so this engine offers no hook points: layer
hooks and logits processors are refused, never dropped. Additive steering
vectors are applied as llama.cpp control vectors (``control``), for one
generation; the KV cache is not reused across a change of vectors. Generation runs through
``Llama.generate`` (the loop ``create_chat_completion`` uses), so a greedy chat here is the
chat llama-cpp-python gives. A prompt starts from the longest prefix of it the KV cache
holds, as there, and the engine says how long (``prompt_cached``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import llama_cpp

from millm_host.api import (
    ContextLengthExceeded,
    FieldNotHonoured,
    InvalidParameter,
    LayerHook,
    ModelDescriptor,
    ModelInfo,
    SamplingParams,
)

from .control import ControlVectors, LayerVectors
from .distribution import Distribution, needed
from .embeddings import MeanPoolingContext
from .loader import LoadOptions, load_llama
from .prefix import chunk, reusable
from .spec import ENGINE_NAME
from .text_engine import GGUFTextEngine

#: llama_decode's code for "no room left in the KV cache".
_DECODE_NO_KV_SLOT = "llama_decode returned 1"


class GGUFEngine(GGUFTextEngine):
    """A llama.cpp model with its vocabulary, chat template and embedding context."""

    def __init__(
        self,
        llm: llama_cpp.Llama,
        descriptor: ModelDescriptor,
        embedder: MeanPoolingContext | None,
        embedding_window: int,
    ) -> None:
        super().__init__(llm._model)
        self.llm = llm
        self._embedder = embedder
        self._embedding_window = embedding_window
        self._control = ControlVectors(llm.ctx, llm.n_embd(), llama_cpp.llama_model_n_layer(llm.model))
        self._kv_vectors: LayerVectors = {}  # the control vectors the KV cache was computed under
        #: Prompt tokens the latest generation found in the KV cache (set when its first token is computed).
        self.prompt_cached = 0
        self._exact = 0  # the KV cache's first tokens that a prompt decode wrote (``prefix``)
        architecture = self.metadata.get("general.architecture", "")
        layers = self.metadata.get(f"{architecture}.block_count")
        self.info = ModelInfo(
            id=descriptor.id,
            engine=ENGINE_NAME,
            hf_id=descriptor.hf_id,
            revision=descriptor.revision,
            dtype=None,  # llama.cpp computes per tensor type; no one dtype to report
            quantization=descriptor.quantization,
            context_window=llm.n_ctx(),
            vocab_size=self.vocab.size,
            d_model=llm.n_embd(),
            n_layers=int(layers) if layers and layers.isdigit() else None,
            chat_template=self.metadata.get("tokenizer.chat_template"),
            bos_token=self.bos_text,
            bos_token_id=self.vocab.bos(),
            eos_token_ids=self.vocab.end_of_generation(),
            device="gpu" if llm.model_params.n_gpu_layers and llama_cpp.llama_supports_gpu_offload() else "cpu",
        )

    @classmethod
    def load(cls, descriptor: ModelDescriptor, settings: Any, progress: Callable[[str], None]) -> GGUFEngine:
        """Load ``descriptor``'s file with the GGUF_* settings (engine thread)."""
        return cls.load_with(descriptor, LoadOptions.from_settings(settings), progress)

    @classmethod
    def load_with(
        cls, descriptor: ModelDescriptor, options: LoadOptions, progress: Callable[[str], None]
    ) -> GGUFEngine:
        """Load ``descriptor``'s file with options already read from the settings."""
        llm = load_llama(descriptor.path, options, progress)
        embedder = None
        window = min(llm.n_ctx(), options.n_batch)
        try:
            if options.embeddings:
                progress(f"creating the mean-pooling embedding context ({window} tokens)")
                embedder = MeanPoolingContext(llm.model, window, llm.n_threads, llm.n_threads_batch)
            return cls(llm, descriptor, embedder, window)
        except BaseException:
            if embedder is not None:
                embedder.close()
            llm.close()
            raise

    @property
    def embedding_window(self) -> int:
        """The longest input ``embed`` takes: the smaller of the context window and the batch."""
        return self._embedding_window

    # --- compute ----------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        hooks: Sequence[LayerHook] = (),
        logits_processors: Sequence[Callable[[Sequence[int], Any], Any]] = (),
    ) -> Generator[int, None, None]:
        prompt, vectors = self.check_generation(prompt_ids, hooks, logits_processors)
        return self.generate_checked(prompt, params, vectors)

    def generate_checked(
        self, prompt: list[int], params: SamplingParams, vectors: LayerVectors
    ) -> Generator[int, None, None]:
        """``generate`` of a request already checked (``check_generation``), steered by ``vectors``."""
        window = self.info.context_window
        assert window is not None  # llama.cpp always has one
        return self._steered(prompt, params, window, vectors)

    def _steered(
        self, prompt: list[int], params: SamplingParams, window: int, vectors: LayerVectors
    ) -> Generator[int, None, None]:
        """The tokens with ``vectors`` set, cleared when the generation ends, fails or is closed."""
        if vectors != self._kv_vectors:  # the cached prefix was computed under other vectors
            self.llm.reset()
            self._exact = 0
            self._kv_vectors = vectors
        if not vectors:
            yield from self._tokens(prompt, params, window)
            return
        try:
            self._control.apply(vectors)
            yield from self._tokens(prompt, params, window)
        finally:
            self._control.clear()

    def _tokens(self, prompt: list[int], params: SamplingParams, window: int) -> Generator[int, None, None]:
        greedy = params.temperature == 0
        # logprobs, logit_bias or min_tokens: the first stage of the chain applies the bias and penalties itself
        distribution = (
            Distribution(params, self.llm.n_vocab(), len(prompt), self.info.eos_token_ids) if needed(params) else None
        )
        sampler = dict(
            temp=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0,  # OpenAI sampling: temperature and nucleus only
            min_p=0.0,
            typical_p=1.0,
            repeat_penalty=1.0,
            frequency_penalty=0.0 if distribution else params.frequency_penalty,
            presence_penalty=0.0 if distribution else params.presence_penalty,
            logits_processor=llama_cpp.LogitsProcessorList([distribution]) if distribution else None,
        )
        tokens = None
        used = len(prompt)
        try:
            start = self._prefill(prompt)
            tokens = self.llm.generate(prompt[start:], reset=False, **sampler)  # _prefill set where the cache ends
            for token in tokens:
                if used == len(prompt):  # the prompt is all in: its cells are reusable
                    self._exact = len(prompt) if len(prompt) >= 2 else 0
                yield distribution.token(token) if distribution else token
                used += 1
                if used >= window:  # the next token would not fit in the KV cache
                    return
        except RuntimeError as exc:
            self.llm.reset()  # the KV cache no longer matches what llama-cpp-python recorded
            self._exact = 0
            if _DECODE_NO_KV_SLOT in str(exc):
                raise ContextLengthExceeded(
                    f"this model's context window ({window} tokens) is full", param="max_tokens"
                ) from None
            raise
        finally:
            if tokens is not None:
                tokens.close()

    def _prefill(self, prompt: list[int]) -> int:
        """Take what the KV cache holds of ``prompt`` (``prefix.reusable``), decode the rest but its last chunk
        in chunks of two tokens at least (``prefix.chunk``); where the last chunk starts (``generate`` decodes it
        and samples). Sets ``prompt_cached``.

        llama-cpp-python's own reuse (``generate(reset=True)``) keeps generated tokens' cells and re-decodes the
        last prompt token alone, either of which can change the output; it also says nothing of what it kept.
        A recurrent model's state cannot be cut short: it starts over."""
        llm = self.llm
        cached = 0
        if llm.n_tokens and not (llm._is_recurrent or llm._is_hybrid):
            cached = reusable(llm.input_ids[: llm.n_tokens].tolist(), self._exact, prompt)
            if cached < llm.n_tokens and not llm._ctx.kv_cache_seq_rm(-1, cached, -1):
                cached = 0
        if cached:
            llm.n_tokens = cached
        else:
            llm.reset()
        self.prompt_cached = self._exact = cached
        start, n_batch = cached, llm.n_batch
        while (take := chunk(len(prompt) - start, n_batch, n_batch)) < len(prompt) - start:
            llm.eval(prompt[start : start + take])
            start += take
        return start

    def embed(self, ids: Sequence[int], pooling: str = "mean") -> list[float]:
        if pooling != "mean":
            raise FieldNotHonoured(
                f"pooling {pooling!r} cannot be honoured: GGUF models are loaded with mean pooling", param="pooling"
            )
        if self._embedder is None:
            raise FieldNotHonoured(
                f"the GGUF model {self.info.id!r} cannot embed on this server: GGUF_ENABLE_EMBEDDINGS is false",
                param="model",
            )
        window = self._embedding_window
        if len(ids) > window:
            raise ContextLengthExceeded(
                f"this model embeds at most {window} tokens per input; the input has {len(ids)} tokens",
                param="input",
            )
        if not ids:
            raise InvalidParameter("an embedding input must not be empty", param="input")
        self.vocab.check(ids, param="input")
        return self._embedder.embed(ids)

    def close(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        self.llm.close()
