"""The transformers engine: a resident HuggingFace causal LM."""

from __future__ import annotations

import collections
import copy
import inspect
import queue
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

import jinja2
import torch
import transformers

from millm_host.api import (
    Engine,
    HookPoint,
    InsufficientMemory,
    InvalidParameter,
    LayerHook,
    LoraAdapter,
    ModelDescriptor,
    ModelInfo,
    NextTokenScores,
    NoChatTemplate,
    PromptTokenScores,
    SamplingParams,
    ScoringParams,
    TokenIterator,
    generation_cancel,
    served_adapter,
)

from . import hooks as layer_hooks
from .adapters import HeldTokens, LoraAdapters
from .batching import BatchScheduler, batchable_model
from .embedding import pooled_last_hidden
from .float32 import score_in_float32
from .intraop import IntraOp, in_passing_thread
from .loader import load_model
from .prefix_cache import PrefixCache
from .sampling import LogitBias, Penalties, choose, generator_for, with_logprobs
from .scoring import last_logits, next_token_scores, prompt_scores
from .spec import ENGINE_NAME, SETTINGS
from .token_span import TokenFloor

#: Copies of the HF tokenizer the engine's own calls share (see ``TransformersEngine.__init__``).
TOKENIZER_COPIES = 4

T = TypeVar("T")
_DONE = object()  # a generation handed to the batch thread ended


class TransformersEngine(Engine):
    """A HuggingFace model and tokenizer, with per-call forward hooks.

    HF fast tokenizers are not thread-safe (a call may reconfigure truncation and
    padding, and the Rust side refuses a second borrower), so each thread gets its
    own copy of the loaded tokenizer, which itself is only ever copied. That lets
    the host tokenize on its text thread while this engine generates.
    """

    name = ENGINE_NAME
    concurrent_text = True
    steps_in_process = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        descriptor: ModelDescriptor,
        device: torch.device,
        dtype: torch.dtype,
        settings: Any,
    ) -> None:
        self.model = model
        self.settings = settings
        # Never used directly: HF fast tokenizers are not safe to share between threads, so each
        # call borrows a copy from a pool. A copy per thread instead cost a deepcopy per request
        # (each request's sequences run on threads of their own). The pool is bounded: a copy takes
        # ~90 ms of the interpreter lock (SmolLM2's), which the running batch waits for, where a
        # borrower keeps one for microseconds (a token's text) to milliseconds (a prompt): past
        # TOKENIZER_COPIES a borrower waits for a copy instead (a drop storm's threads grew it
        # for ever, a copy every second, issue 35).
        self._tokenizer_original = tokenizer
        self._tokenizer_lock = threading.Lock()  # serializes making copies
        self._tokenizer_free = threading.Condition()  # guards the pool; notified when a copy comes back
        self._tokenizer_pool: list[Any] = []
        self._tokenizer_copies = 0  # made for the pool (in it or borrowed)
        self._tokenizers = threading.local()  # for ``tokenizer``: plugins that read the HF tokenizer
        self.descriptor = descriptor
        self.device = device
        self.dtype = dtype
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        n_layers = getattr(text_config, "num_hidden_layers", None)
        self.layers = layer_hooks.decoder_layers(model, n_layers)
        n_layers = len(self.layers)
        self.hook_points = tuple(
            HookPoint(layer, point) for layer in range(n_layers) for point in ("resid_pre", "resid_post")
        )
        self.info = ModelInfo(
            id=descriptor.id,
            engine=ENGINE_NAME,
            hf_id=descriptor.hf_id,
            revision=descriptor.revision,
            dtype=str(dtype).removeprefix("torch."),
            quantization=descriptor.quantization,
            context_window=getattr(text_config, "max_position_embeddings", None),
            vocab_size=self._vocab_size(text_config),
            d_model=getattr(text_config, "hidden_size", None),
            n_layers=n_layers,
            chat_template=tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None,
            bos_token=tokenizer.bos_token,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_ids=self._eos_ids(model, tokenizer),
            device=str(device),
        )
        self._token_floor = TokenFloor.of(tokenizer)
        self._position = layer_hooks.Position()
        # transformers 5 renamed past_key_values to cache.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._tokenizer_pool.append(copy.deepcopy(tokenizer))  # the first copy, made now
        self._tokenizer_copies = 1
        self._intraop = IntraOp.confine(device)
        #: LoRA adapters injected into the model in place (``adapters``): each request's passes use its own.
        self.adapters = LoraAdapters(model, device, self._soon)
        self._start_batching(settings)

    def _start_batching(self, settings: Any) -> None:
        """With ``MILLM_BATCHING=continuous``, generations share decode steps (``batching``).

        The batch scheduler's thread is then the only one that runs the model: the engine's
        other model work is handed to it (``_model_work``). In serial mode it runs where it is
        called, on the engine thread.
        """
        mode = settings["MILLM_BATCHING"]
        if mode not in ("serial", "continuous"):
            raise ValueError(f"MILLM_BATCHING={mode!r}: use serial or continuous")
        self._serial_reasons: collections.Counter[str] = collections.Counter()
        self._counting = threading.Lock()
        self.batch: BatchScheduler | None = None
        self.batching_unavailable = None if mode == "serial" else batchable_model(self.model)
        self.concurrent_generation = mode == "continuous" and self.batching_unavailable is None
        if self.concurrent_generation:
            self.batch = BatchScheduler(
                self.model,
                self.layers,
                self.device,
                self.info.vocab_size or 0,
                self.info.eos_token_ids,
                self.info.context_window,
                self._cache_arg,
                max_rows=settings["MILLM_BATCH_MAX_ROWS"],
                prefill_chunk=settings["MILLM_PREFILL_CHUNK"],
                gather_s=settings["MILLM_BATCH_GATHER_MS"] / 1000,
                intraop=self._intraop,
                selection=self.adapters.selection,
                prefix_cache=PrefixCache(settings["MILLM_PREFIX_CACHE_MB"] << 20)
                if settings["MILLM_PREFIX_CACHE_MB"] > 0
                else None,
            )
            if self.batch.prefix_cache is not None:
                self.adapters.on_delete = self.batch.prefix_cache.clear

    @classmethod
    def load(cls, descriptor: ModelDescriptor, settings: Any, progress: Callable[[str], None]) -> TransformersEngine:
        for setting in SETTINGS:  # loaded outside a host (tests, benches): the engine declares its own
            if setting.name not in settings:
                settings.declare(setting)
        model, tokenizer, device, dtype = in_passing_thread(lambda: load_model(descriptor, settings, progress))
        return cls(model, tokenizer, descriptor, device, dtype, settings)

    def _vocab_size(self, text_config: Any) -> int:
        embeddings = self.model.get_input_embeddings()
        return int(embeddings.weight.shape[0]) if embeddings is not None else int(text_config.vocab_size)

    @staticmethod
    def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(model, "generation_config", None), model.config):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        return frozenset(ids)

    # --- text -------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        """This thread's own copy of the HF tokenizer, for plugins that read it (structured output's
        llguidance table). The engine's own calls borrow pooled copies instead (``_tokenizer``)."""
        tokenizer = getattr(self._tokenizers, "tokenizer", None)
        if tokenizer is None:
            with self._tokenizer_lock:
                tokenizer = copy.deepcopy(self._tokenizer_original)
            self._tokenizers.tokenizer = tokenizer
        return tokenizer

    @contextmanager
    def _tokenizer(self) -> Iterator[Any]:
        """A copy of the HF tokenizer that no other thread uses meanwhile: a free one, a new one while
        fewer than ``TOKENIZER_COPIES`` exist, else the first one given back."""
        with self._tokenizer_free:
            while not self._tokenizer_pool and self._tokenizer_copies >= TOKENIZER_COPIES:
                self._tokenizer_free.wait()
            tokenizer = self._tokenizer_pool.pop() if self._tokenizer_pool else None
            if tokenizer is None:
                self._tokenizer_copies += 1
        if tokenizer is None:
            try:
                with self._tokenizer_lock:
                    tokenizer = copy.deepcopy(self._tokenizer_original)
            except BaseException:
                with self._tokenizer_free:
                    self._tokenizer_copies -= 1
                    self._tokenizer_free.notify()
                raise
        try:
            yield tokenizer
        finally:
            with self._tokenizer_free:
                self._tokenizer_pool.append(tokenizer)
                self._tokenizer_free.notify()

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        with self._tokenizer() as tokenizer:
            return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def min_tokens(self, texts: Sequence[str]) -> int:
        return 0 if self._token_floor is None else self._token_floor.tokens(texts)

    def decode(self, ids: Sequence[int]) -> str:
        with self._tokenizer() as tokenizer:
            return tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_bytes(self, token_id: int) -> bytes:
        with self._tokenizer() as tokenizer:
            return tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def detokenize(self, ids: Sequence[int]) -> str:
        with self._tokenizer() as tokenizer:
            if tokenizer.clean_up_tokenization_spaces:  # transformers cleans the text up after the library decodes
                return tokenizer.decode(list(ids), skip_special_tokens=False)  # spaces a word-piece joins are kept
            # The same text, but the library's decode_batch lets the GIL go while it decodes, where decode holds
            # it (500,000 ids: 100-200 ms, the event loop waiting); converting the ids still holds it, ~6-14 ms.
            return tokenizer.backend_tokenizer.decode_batch([list(ids)], skip_special_tokens=False)[0]

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        if self.info.chat_template is None:
            raise NoChatTemplate(f"model {self.info.id!r} has no chat template")
        try:
            with self._tokenizer() as tokenizer:
                return tokenizer.apply_chat_template(
                    [dict(m) for m in messages],
                    tools=list(tools) if tools else None,
                    add_generation_prompt=add_generation_prompt,
                    tokenize=False,
                    **dict(template_kwargs or {}),
                )
        except jinja2.TemplateError as exc:  # the template's own raise_exception: a refusal of the input
            raise InvalidParameter(
                f"the chat template of {self.info.id} refuses these messages: {exc}", param="messages"
            ) from None

    # --- compute ----------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, cache: Any, start: int, keep_last: bool, adapter: str | None = None) -> Any:
        """One pass; with ``adapter``, that LoRA adapter's (else whatever the caller selected: the base)."""
        if adapter is not None:
            with self.adapters.selection.rows(adapter):
                return self._forward(ids, cache, start, keep_last)
        self._position.start = start
        kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": cache is not None}
        if cache is not None:
            kwargs[self._cache_arg] = cache
        if keep_last:
            kwargs["logits_to_keep"] = 1
        with self._typed_out_of_memory("generating: the prompt and its KV cache do not fit beside the model"):
            return self.model(**kwargs)

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        hooks: Sequence[LayerHook] = (),
        logits_processors: Sequence[Callable[[Sequence[int], Any], Any]] = (),
    ) -> TokenIterator:
        adapter = self._adapter_held()
        if self.batch is not None:
            reason = self._serial_reason(hooks)
            if reason is None:
                tokens: Any = self.batch.submit(prompt_ids, params, logits_processors, hooks, adapter=adapter)
                return tokens if adapter is None else HeldTokens(tokens, self.adapters, adapter)
            self._count_serial(reason)
        tokens = self._serial(prompt_ids, params, hooks, logits_processors, adapter)
        return tokens if adapter is None else HeldTokens(tokens, self.adapters, adapter)

    def _adapter_held(self) -> str | None:
        """The name of the request's adapter (None: the base), loaded and held until its generation ends."""
        adapter = served_adapter()
        if adapter is None:
            return None
        self.adapters.acquire(adapter.name)  # first: an unload meanwhile waits for this generation
        try:
            if not self.adapters.loaded(adapter):
                self._model_work(lambda: self.adapters.load(adapter, param="model"))
        except BaseException:
            self.adapters.release(adapter.name)
            raise
        return adapter.name

    def _served(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the model's thread, every pass it makes with the request's adapter (loaded first)."""
        adapter = served_adapter()
        if adapter is None:
            return self._model_work(fn)

        def adapted() -> T:
            if not self.adapters.loaded(adapter):
                self.adapters.load(adapter, param="model")
            with self.adapters.selection.rows(adapter.name):
                return fn()

        return self._model_work(adapted)

    def _soon(self, fn: Callable[[], None]) -> None:
        """``fn`` on the model's thread: between two batch steps, or now (serial: the caller is that thread)."""
        if self.batch is not None:
            self.batch.call_soon(fn)
        else:
            fn()

    def load_adapter(self, adapter: LoraAdapter) -> None:
        self._model_work(lambda: self.adapters.load(adapter))

    def unload_adapter(self, name: str) -> None:
        self._model_work(lambda: self.adapters.unload(name))

    def _serial_reason(self, hooks: Sequence[LayerHook]) -> str | None:
        """Why a generation must run alone while batching is on (None: it joins the batch)."""
        # The probes plugin's switch: an operator who wants armed probes to read unbatched passes.
        if self.settings.get("PROBE_FORCE_SERIAL") and any(hook.owner == "probes" for hook in hooks):
            return "probe_force_serial"
        return None

    def _serial(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        hooks: Sequence[LayerHook],
        logits_processors: Sequence[Callable[[Sequence[int], Any], Any]],
        adapter: str | None = None,
    ) -> Generator[int, None, None]:
        def alone() -> Generator[int, None, None]:  # its hooks installed from its first pass to its last
            with layer_hooks.installed(self.layers, hooks, self._position):
                yield from self._generate(prompt_ids, params, logits_processors, adapter)

        if self.batch is None:
            self._enter_model_thread()
            yield from alone()
        else:
            yield from self._on_batch_thread(alone(), params.max_tokens)

    def _on_batch_thread(self, generated: Generator[int, None, None], max_tokens: int) -> Generator[int, None, None]:
        """The tokens of a generation that runs alone, run on the batch thread (no step runs meanwhile).

        It runs ahead of its reader until its last token (EOS, ``max_tokens``, the window),
        or until the reader closes it or the request is cancelled.
        """
        assert self.batch is not None
        tokens: queue.SimpleQueue = queue.SimpleQueue()
        closed = threading.Event()
        cancel = generation_cancel()
        eos = self.info.eos_token_ids

        def run() -> None:
            try:
                for count, token in enumerate(generated, start=1):
                    tokens.put(token)
                    if int(token) in eos or count >= max_tokens:
                        break
                    if closed.is_set() or (cancel is not None and cancel.is_set()):
                        break
            except BaseException as exc:
                tokens.put(exc)
            finally:
                generated.close()

        def ended(future: Future) -> None:  # it ran, or never will (the model was unloaded first)
            if not future.cancelled() and future.exception() is not None:
                tokens.put(future.exception())
            tokens.put(_DONE)

        self.batch.call_soon(run).add_done_callback(ended)
        try:
            while True:
                item = tokens.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            closed.set()

    def _enter_model_thread(self) -> None:
        if self._intraop is not None:
            self._intraop.enter()

    def _model_work(self, fn: Callable[[], T]) -> T:
        """``fn()``, on the thread that runs the model: the batch thread, or this one."""
        if self.batch is not None:
            return self.batch.call(fn)
        self._enter_model_thread()
        return fn()

    def _count_serial(self, reason: str) -> None:
        with self._counting:
            self._serial_reasons[reason] += 1

    def inference(self) -> dict[str, Any]:
        """The generation backend, the batch's size and queue, and why generations ran alone."""
        batch = self.batch
        with self._counting:
            reasons = dict(self._serial_reasons)
        return {
            "backend": "continuous" if batch is not None else "serial",
            "batching_unavailable": self.batching_unavailable,
            "max_rows": batch.max_rows if batch is not None else 1,
            "running": batch.running if batch is not None else None,
            "waiting": batch.waiting if batch is not None else None,
            "steps": batch.steps if batch is not None else None,
            # Rows that joined the batch: a generation cancelled while it waited never did.
            "batched": batch.joined if batch is not None else 0,
            "left_waiting": batch.left_waiting if batch is not None else 0,
            "serial_reasons": reasons,
            "prefix_cache": self._prefix_cache_stats(),
        }

    def _prefix_cache_stats(self) -> dict[str, Any] | None:
        cache = self.batch.prefix_cache if self.batch is not None else None
        return None if cache is None else cache.stats()

    def status(self) -> dict[str, Any]:
        """The prefix cache's counts, when there is one (``/metrics`` counts its hits and misses from them)."""
        stats = self._prefix_cache_stats()
        return {} if stats is None else {"prefix_cache": stats}

    @torch.inference_mode()
    def _generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        processors: Sequence[Callable[[Sequence[int], Any], Any]],
        adapter: str | None = None,
    ) -> Generator[int, None, None]:
        generator = generator_for(params, self.device)
        penalties = Penalties(params, self.info.vocab_size, self.device, self.info.eos_token_ids)
        bias = LogitBias(params, self.device)
        cache = transformers.DynamicCache()
        window = self.info.context_window
        position = len(prompt_ids)
        output = self._forward(torch.tensor([list(prompt_ids)], device=self.device), cache, 0, True, adapter)
        generated: list[int] = []
        while True:
            logits = output.logits[0, -1].float()
            logits = penalties.apply(bias.apply(logits))
            for process in processors:
                logits = process(generated, logits)
            token = choose(logits, params, generator)
            yield token if params.logprobs is None else with_logprobs(token, logits, params)
            generated.append(token)
            penalties.record(token)
            if window is not None and position >= window:
                return
            output = self._forward(torch.tensor([[token]], device=self.device), cache, position, True, adapter)
            position += 1

    def forward(self, ids: Sequence[int], *, hooks: Sequence[LayerHook] = ()) -> None:
        @torch.inference_mode()
        def run() -> None:
            with layer_hooks.installed(self.layers, hooks, self._position):
                self._forward(torch.tensor([list(ids)], device=self.device), None, 0, keep_last=True)

        self._served(run)

    def replay_in_batch(self, rows: Sequence[tuple[Sequence[int], Sequence[int], Sequence[LayerHook]]]) -> None:
        """Through the continuous batch, as generations that arrive together (``BatchScheduler.replay``)."""
        if self.batch is None:
            super().replay_in_batch(rows)
        else:
            self.batch.replay(rows)

    def score_next_token(
        self, prompts: Sequence[Sequence[int]], params: ScoringParams, *, hooks: Sequence[LayerHook] = ()
    ) -> list[NextTokenScores]:
        """One forward pass per prompt; the math is in ``scoring``, the copy in ``float32``."""

        def score(model: Any, device: torch.device) -> list[NextTokenScores]:
            results = []
            for index, ids in enumerate(prompts):
                self._position.start = 0  # read hooks see each prompt from its first position
                results.append(next_token_scores(last_logits(model, ids, device), params, index))
            return results

        if params.precision != "float32":

            def hooked() -> list[NextTokenScores]:
                with (
                    layer_hooks.installed(self.layers, hooks, self._position),
                    self._typed_out_of_memory("scoring the input beside the model"),
                ):
                    return score(self.model, self.device)

            return self._served(hooked)
        if hooks:
            raise InvalidParameter(
                "float32 scoring runs on a copy of the model: it takes no layer hooks", param="scoring_precision"
            )
        return self._served(  # the copy is made from the model (its LoRA layers too), or is the model
            lambda: score_in_float32(
                self.model,
                self.device,
                self.dtype,
                self.descriptor.format,
                self.settings["SCORING_FLOAT32_DEVICE"],
                self.settings["SCORING_FLOAT32_HEADROOM_MB"],
                score,
            )
        )

    def score_prompt(self, prompts: Sequence[Sequence[int]], top: int) -> list[list[PromptTokenScores]]:
        """Scoring's pass over each prompt, in chunks of positions (``scoring.prompt_scores``), no hook."""

        def score() -> list[list[PromptTokenScores]]:
            with self._typed_out_of_memory("scoring the prompt beside the model"):
                return [
                    prompt_scores(self.model, ids, self.device, top, index, self._cache_arg)
                    for index, ids in enumerate(prompts)
                ]

        return self._served(score)

    def embed(self, ids: Sequence[int], pooling: str = "mean") -> list[float]:
        def run() -> list[float]:
            with self._typed_out_of_memory("embedding the input beside the model"):
                return pooled_last_hidden(self.model, ids, self.device, pooling)

        return self._served(run)

    @contextmanager
    def _typed_out_of_memory(self, work: str) -> Iterator[None]:
        """Running out of memory is the same typed 503 as in generation."""
        try:
            yield
        except (torch.OutOfMemoryError, MemoryError) as exc:
            raise InsufficientMemory(
                f"{self.device} ran out of memory {work} ({exc})",
                type="invalid_request_error",
            ) from None

    def close(self) -> None:
        if self.batch is not None:
            self.batch.close()
            self.batch = None
        self.model = None
        self.layers = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
