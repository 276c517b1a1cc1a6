"""Constrained decoding with llguidance: a grammar per schema, a matcher per sequence.

Why llguidance (not outlines-core, which is also installed): measured on this
subset, outlines-core 0.2 compiles ``minimum``/``maximum``, ``pattern`` together
with ``minLength``/``maxLength``, and ``maxItems`` without ``items`` into regexes
that do not enforce them, and building its token index for ``json_object`` takes
seconds. llguidance enforces every keyword of the subset, compiles in
milliseconds and computes each token mask in well under a millisecond.

The grammar is compiled from ``grammar_schema`` (objects closed, post-checked
keywords left to validation). Grammars are cached by schema; tokenizers and ready matchers by resident model.
The per-token work is a plain callable the engine calls (``JsonConstraint``).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import llguidance

from .errors import ResponseFormatUnsupported
from .grammar_schema import grammar_schema
from .response_format import PARAM, ResponseFormat

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # in the stubs only, not exported at run time

    from millm_host.api import Engine

#: One space after ',' and ':' and nowhere else: the layout models are trained on,
#: and no room for a small model to wander into endless whitespace.
JSON_LAYOUT: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
GRAMMAR_CACHE_SIZE = 256
MATCHER_CACHE_SIZE = 64


class _LRU(OrderedDict):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: Any, value: Any) -> Any:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)
        return value

    def hit(self, key: Any) -> Any:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value


class ConstraintCompiler:
    """Compiles response formats into llguidance grammars and matchers, with caches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._grammars = _LRU(GRAMMAR_CACHE_SIZE)
        self._per_engine: weakref.WeakKeyDictionary[Any, tuple[Any, _LRU]] = weakref.WeakKeyDictionary()

    def grammar(self, fmt: ResponseFormat) -> str:
        """The llguidance grammar for ``fmt`` (cached); refuses what it cannot compile."""
        with self._lock:
            cached = self._grammars.hit(fmt.key)
        if cached is not None:
            return cached
        schema = {} if fmt.schema is True else grammar_schema(fmt.schema)
        if schema is False:
            raise ResponseFormatUnsupported("the schema false accepts no document", param=PARAM)
        try:
            if fmt.lark is not None:
                grammar = llguidance.LLMatcher.grammar_from_lark(fmt.lark)
            else:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        except ValueError as exc:
            raise ResponseFormatUnsupported(f"the schema cannot be compiled: {exc}", param=PARAM) from None
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            raise ResponseFormatUnsupported(f"the schema cannot be enforced: {messages[0]}", param=PARAM)
        with self._lock:
            return self._grammars.put(fmt.key, grammar)

    def prepare(self, engine: Engine, fmt: ResponseFormat) -> llguidance.LLMatcher:
        """The cached matcher in its start state for ``fmt`` on ``engine`` (built once).

        Called from the text thread (``before_tokenize``) and the engine thread
        (``before_forward``) at once, hence the lock around the caches.
        """
        tokenizer, matchers = self._engine_cache(engine)
        with self._lock:
            ready = matchers.hit(fmt.key)
        if ready is None:
            ready = llguidance.LLMatcher(tokenizer, self.grammar(fmt))
            if ready.is_error():
                raise ResponseFormatUnsupported(f"the schema cannot be enforced: {ready.get_error()}", param=PARAM)
            with self._lock:
                ready = matchers.hit(fmt.key) or matchers.put(fmt.key, ready)
        return ready

    def matcher(self, engine: Engine, fmt: ResponseFormat) -> llguidance.LLMatcher:
        """A fresh matcher for one sequence (engine thread), copied from the cached one."""
        return self.prepare(engine, fmt).deep_copy()

    def warm(self, engine: Engine) -> None:
        """Build what ``prepare`` needs of ``engine`` (its llguidance tokenizer) ahead of any request."""
        self._engine_cache(engine)

    def forget(self, engine: Engine) -> None:
        """Drop what was built for ``engine`` (it is being unloaded)."""
        with self._lock:
            self._per_engine.pop(engine, None)

    def _engine_cache(self, engine: Engine) -> tuple[Any, _LRU]:
        with self._lock:
            entry = self._per_engine.get(engine)
        if entry is None:
            built = (llm_tokenizer(engine), _LRU(MATCHER_CACHE_SIZE))
            with self._lock:
                entry = self._per_engine.setdefault(engine, built)
        return entry


def llm_tokenizer(engine: Engine) -> llguidance.LLTokenizer:
    """llguidance's view of the engine's HF tokenizer: token bytes, EOS ids, logits width."""
    import llguidance.hf

    hf_tokenizer = getattr(engine, "tokenizer", None)
    if hf_tokenizer is None:
        raise ResponseFormatUnsupported(f"the {engine.name} engine exposes no tokenizer to constrain with", param=PARAM)
    eos = sorted(engine.info.eos_token_ids)
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    try:
        if backend is not None and backend.padding is None and backend.truncation is None:
            # what llguidance.hf.from_tokenizer builds, without its copy of the tokenizer (made only to turn
            # padding and truncation off): the copy held the GIL another 120 ms
            return llguidance.LLTokenizer(backend.to_str(), n_vocab=engine.info.vocab_size, eos_token=eos)
        return llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=engine.info.vocab_size, eos_token=eos)
    except ValueError as exc:  # e.g. a slow (Python) tokenizer, which llguidance cannot read
        raise ResponseFormatUnsupported(
            f"{engine.info.id}'s tokenizer cannot be constrained: {exc}", param=PARAM
        ) from None


class JsonConstraint:
    """The per-sequence logits processor: disallowed tokens get ``-inf``.

    EOS is allowed exactly when the document is complete (llguidance's accepting
    state). If the matcher ever fails, only EOS stays allowed, so the sequence
    ends and validation reports it instead of sampling from an empty mask.
    """

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, eos_ids: Sequence[int]) -> None:
        import numpy as np
        import torch

        self._np, self._torch = np, torch
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.eos_ids = list(eos_ids)
        self._consumed = 0
        self._mask = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)
        self._mask_bytes = self._mask.numpy().view(np.uint8)

    def __call__(self, generated: Sequence[int], logits: Any) -> Any:
        for token in generated[self._consumed :]:
            self.matcher.consume_token(token)
        self._consumed = len(generated)
        allowed = self._allowed()
        if allowed.device != logits.device:
            allowed = allowed.to(logits.device)
        return logits.masked_fill(~allowed[: logits.shape[-1]], float("-inf"))

    def _allowed(self) -> Any:
        torch = self._torch
        if not self.matcher.is_error():
            self.matcher.unsafe_compute_mask_ptr(self._mask.data_ptr(), self._mask.numel() * 4)
            bits = self._np.unpackbits(self._mask_bytes, bitorder="little")[: self.vocab_size]
            allowed = torch.from_numpy(bits).bool()
            if bool(allowed.any()):
                return allowed
        allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
        allowed[self.eos_ids] = True
        return allowed
