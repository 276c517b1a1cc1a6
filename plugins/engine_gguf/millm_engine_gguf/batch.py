"""Several generations in one llama.cpp context (child side, ``GGUF_PARALLEL`` > 1).

As llama.cpp's own server does with ``--parallel``: one context with ``n_seq_max``
sequences over a unified KV cache, each generation a sequence (a row). One
``llama_decode`` per step feeds every running row its next token (a new row its
prompt, in chunks that share the step's ``n_batch`` tokens), then each row samples
from its own logits with its own generator. Rows join and leave between steps; a
row's KV cells are removed when it leaves.

Only plain sampling runs here (greedy, or temperature and top_p with a per-row
seed); steering, penalties, logit_bias, logprobs and min_tokens (ignore_eos) run
alone on the serial context (``serial_reason``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import llama_cpp
import numpy as np

from millm_host.api import SamplingParams

from .distribution import needed


def serial_reason(params: SamplingParams, vectors: dict) -> str | None:
    """Why a generation cannot be a row of the batch (None: it can)."""
    if vectors:
        return "steering"  # llama.cpp's control vector is one per context
    if params.min_tokens:
        return "min_tokens"  # the EOS mask is the serial chain's first stage (``distribution``)
    if needed(params):
        return "logprobs_or_logit_bias"
    if params.frequency_penalty or params.presence_penalty:
        return "penalties"
    return None


@dataclass
class Row:
    key: int  # the server's id of the generation
    seq: int  # its llama.cpp sequence
    params: SamplingParams
    feed: list[int]  # tokens not yet decoded (the prompt, then each sampled token)
    pos: int = 0  # next position of the sequence
    count: int = 0  # tokens sampled
    paused: bool = False
    rng: np.random.Generator = field(default_factory=np.random.default_rng)


class BatchContext:
    """A llama.cpp context of ``rows`` sequences, each up to ``window`` tokens."""

    def __init__(self, model, rows: int, window: int, n_batch: int, n_threads: int, n_threads_batch: int) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = rows * window
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = rows
        params.kv_unified = True
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as Llama creates its context
        params.n_threads, params.n_threads_batch = n_threads, n_threads_batch
        self._ctx = llama_cpp.llama_init_from_model(model, params)
        if not self._ctx:
            raise RuntimeError("llama.cpp could not create the batch context")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        self.max_rows, self.window, self.n_batch = rows, window, n_batch
        self.rows: dict[int, Row] = {}
        self.steps = 0

    # --- rows -------------------------------------------------------------------------
    def has_room(self) -> bool:
        return len(self.rows) < self.max_rows

    def add(self, key: int, prompt: list[int], params: SamplingParams) -> None:
        used = {row.seq for row in self.rows.values()}
        seq = next(s for s in range(self.max_rows) if s not in used)
        rng = np.random.default_rng(params.seed)
        self.rows[key] = Row(key, seq, params, list(prompt), rng=rng)

    def remove(self, key: int) -> None:
        row = self.rows.pop(key, None)
        if row is not None:
            llama_cpp.llama_memory_seq_rm(self._memory, row.seq, -1, -1)

    def running(self) -> bool:
        """Some row can step (not every row waits for the server's word)."""
        return any(not row.paused for row in self.rows.values())

    # --- a step -----------------------------------------------------------------------
    def step(self) -> Iterator[tuple[Row, int]]:
        """One decode of every running row; (row, token) for each row that sampled one."""
        batch, budget = self._batch, self.n_batch
        batch.n_tokens = 0
        sampling: list[tuple[Row, int]] = []
        for row in [r for r in self.rows.values() if not r.paused and r.feed]:
            if budget == 0:
                break
            take = row.feed[:budget]
            del row.feed[: len(take)]
            budget -= len(take)
            for token in take:
                i = batch.n_tokens
                batch.token[i], batch.pos[i] = token, row.pos
                batch.n_seq_id[i], batch.seq_id[i][0] = 1, row.seq
                batch.logits[i] = False
                batch.n_tokens += 1
                row.pos += 1
            if not row.feed:  # the row's input is all in: sample its next token
                batch.logits[batch.n_tokens - 1] = True
                sampling.append((row, batch.n_tokens - 1))
        if batch.n_tokens == 0:
            return
        code = llama_cpp.llama_decode(self._ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code} in a batch step")
        self.steps += 1
        for row, index in sampling:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, index), shape=(self.n_vocab,))
            token = sample(logits, row.params, row.rng)
            row.count += 1
            row.feed.append(token)
            yield row, token

    def close(self) -> None:
        if self._ctx:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            self._ctx = None


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Greedy at temperature 0; else softmax at the temperature, cut to the top_p nucleus."""
    if params.temperature == 0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    if params.top_p < 1.0:
        cumulative = np.cumsum(probs[order])
        keep = int(np.searchsorted(cumulative, params.top_p)) + 1
        order = order[:keep]
    kept = probs[order] / probs[order].sum()
    return int(order[rng.choice(len(order), p=kept)])
