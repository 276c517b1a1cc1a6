"""The GGUF engine: a .gguf file resident in llama.cpp through llama-cpp-python.

llama.cpp exposes no module tree, so this engine offers no hook points: layer
hooks and logits processors are refused, never dropped. Generation runs through
``Llama.generate`` (the loop ``create_chat_completion`` uses, with its KV-cache
prefix reuse), so a greedy chat here is the chat llama-cpp-python gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import llama_cpp

from millm_host.api import (
    ContextLengthExceeded,
    Engine,
    FieldNotHonoured,
    InvalidParameter,
    LayerHook,
    ModelDescriptor,
    ModelInfo,
    SamplingParams,
)

from .chat import ChatTemplate
from .embeddings import MeanPoolingContext
from .loader import LoadOptions, load_llama
from .spec import ENGINE_NAME
from .vocab import Vocab

#: llama_decode's code for "no room left in the KV cache".
_DECODE_NO_KV_SLOT = "llama_decode returned 1"


class GGUFEngine(Engine):
    """A llama.cpp model with its vocabulary, chat template and embedding context."""

    name = ENGINE_NAME
    hook_points = ()

    def __init__(self, llm: llama_cpp.Llama, descriptor: ModelDescriptor, embedder: MeanPoolingContext | None,
                 embedding_window: int) -> None:
        self.llm = llm
        self.vocab = Vocab(llm.model)
        self._embedder = embedder
        self._embedding_window = embedding_window
        metadata = llm.metadata
        bos = self.vocab.bos()
        bos_text = self.vocab.piece(bos, special=True).decode("utf-8", "replace") if bos is not None else None
        eos = llm.token_eos()
        eos_text = self.vocab.piece(eos, special=True).decode("utf-8", "replace") if eos >= 0 else ""
        template = metadata.get("tokenizer.chat_template")
        self.template = ChatTemplate(template, bos_text or "", eos_text) if template else None
        architecture = metadata.get("general.architecture", "")
        layers = metadata.get(f"{architecture}.block_count")
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
            chat_template=template,
            bos_token=bos_text,
            bos_token_id=bos,
            eos_token_ids=self.vocab.end_of_generation(),
            device="gpu" if llm.model_params.n_gpu_layers and llama_cpp.llama_supports_gpu_offload() else "cpu",
        )

    @classmethod
    def load(cls, descriptor: ModelDescriptor, settings: Any, progress: Callable[[str], None]) -> GGUFEngine:
        """Load ``descriptor``'s file with the GGUF_* settings (engine thread)."""
        options = LoadOptions.from_settings(settings)
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

    # --- text -------------------------------------------------------------------------
    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidParameter(f"the text is not valid Unicode: {exc.reason} at character {exc.start}") from None
        return self.llm.tokenize(data, add_bos=add_special_tokens, special=True)

    def decode(self, ids: Sequence[int]) -> str:
        return self.vocab.detokenize(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return self.vocab.piece(token_id, special=True)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The file's own template. ``template_kwargs`` are not passed: the host reports them."""
        if tools:
            raise FieldNotHonoured("tools cannot be honoured by the gguf engine", param="tools")
        if self.template is None:
            return super().render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                       template_kwargs=template_kwargs)
        return self.template.render(messages, add_generation_prompt)

    # --- compute ----------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        hooks: Sequence[LayerHook] = (),
        logits_processors: Sequence[Callable[[Sequence[int], Any], Any]] = (),
    ) -> Iterator[int]:
        if hooks:
            raise FieldNotHonoured("the gguf engine has no hookable layers", param=None)
        if logits_processors:
            raise FieldNotHonoured("the gguf engine cannot constrain generation", param=None)
        window = self.info.context_window
        if len(prompt_ids) >= window:
            raise ContextLengthExceeded(
                f"this model's maximum context length is {window} tokens; the prompt has {len(prompt_ids)} tokens",
                param="messages",
            )
        self.vocab.check(prompt_ids, param="prompt")
        return self._tokens(list(prompt_ids), params, window)

    def _tokens(self, prompt: list[int], params: SamplingParams, window: int) -> Iterator[int]:
        greedy = params.temperature == 0
        tokens = self.llm.generate(
            prompt,
            temp=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0,  # OpenAI sampling: temperature and nucleus only
            min_p=0.0,
            typical_p=1.0,
            repeat_penalty=1.0,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            reset=True,
        )
        used = len(prompt)
        try:
            for token in tokens:
                yield token
                used += 1
                if used >= window:  # the next token would not fit in the KV cache
                    return
        except RuntimeError as exc:
            self.llm.reset()  # the KV cache no longer matches what llama-cpp-python recorded
            if _DECODE_NO_KV_SLOT in str(exc):
                raise ContextLengthExceeded(
                    f"this model's context window ({window} tokens) is full", param="max_tokens"
                ) from None
            raise
        finally:
            tokens.close()

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
