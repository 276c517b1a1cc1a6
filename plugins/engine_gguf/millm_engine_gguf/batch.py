"""Several generations in one llama.cpp context (child side, ``GGUF_PARALLEL`` > 1).

As llama.cpp's own server does with ``--parallel``: one context with ``n_seq_max``
sequences (slots), each with a KV cache of its own (``kv_unified`` off), each
generation a row on a slot. A step is one ``llama_decode`` of every running row's
next token (ordered by sequence: llama.cpp splits a batch where sequence ids skip),
then one of each new row's prompt chunk, alone (``prefix.chunk``: never a one-token
chunk); each row then samples from its own logits (``sampling``). So a row computes
what it computes alone: its cells and its attention are its own, a one-token row of a
step is the serial engine's one-token decode, and a prompt chunk decodes as the serial
engine's prompt does. Rows join and leave between steps.

A slot keeps its KV cells when its row leaves, as llama-server's ``cache_prompt``
does: a new row takes the free slot whose cached prompt shares the longest prefix
with its own (ties: the lowest sequence, which keeps running rows' sequences
together), and decodes only the rest (``prefix.reusable``: only cells a prompt
decode wrote, and two tokens at least), so reuse never changes what a row computes.

Every request runs here but a steered one (``serial_reason``): llama.cpp's control
vectors are one per context, so it runs alone on the serial context.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Collection
from dataclasses import dataclass, field

import llama_cpp
import numpy as np

from millm_host.api import SamplingParams

from .prefix import chunk, reusable
from .sampling import RowSampler


def serial_reason(params: SamplingParams, vectors: dict) -> str | None:
    """Why a generation cannot be a row of the batch (None: it can)."""
    if vectors:
        return "steering"  # llama.cpp's control vector is one per context
    return None


@dataclass
class Slot:
    """A llama.cpp sequence and the tokens whose KV cells it holds (position i holds ``tokens[i]``)."""

    seq: int
    tokens: list[int] = field(default_factory=list)
    exact: int = 0  # the first ``exact`` tokens were written by prompt decodes (reusable)
    last_used: int = 0


@dataclass
class Row:
    key: int  # the server's id of the generation
    slot: Slot
    params: SamplingParams
    feed: list[int]  # tokens not yet decoded (the prompt's rest, then each sampled token)
    sampler: RowSampler
    cached: int = 0  # prompt tokens found in the slot's cells
    prefilling: bool = True  # its prompt is not all decoded yet
    count: int = 0  # tokens sampled
    paused: bool = False

    @property
    def pos(self) -> int:
        """The next position of the sequence."""
        return len(self.slot.tokens)


@dataclass
class StepTimes:
    """Where the child's time went in batch steps (seconds, summed), for the bench's profile."""

    steps: int = 0
    rows: int = 0  # rows that sampled, summed over steps
    build: float = 0.0  # filling llama_batch
    decode: float = 0.0  # llama_decode of the running rows
    prefill: float = 0.0  # llama_decode of prompt chunks
    sample: float = 0.0  # logits to tokens

    def as_dict(self) -> dict[str, float]:
        return dict(vars(self))


class BatchContext:
    """A llama.cpp context of ``rows`` sequences, each up to ``window`` tokens."""

    def __init__(
        self,
        model,
        rows: int,
        window: int,
        n_batch: int,
        n_threads: int,
        n_threads_batch: int,
        eos_ids: Collection[int] = (),
        flash_attn: bool = False,
    ) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = rows * window
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = rows
        params.kv_unified = False  # a cache per sequence: a row's attention never sums over another's cells
        # as the serial context has it (GGUF_FLASH_ATTN)
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.n_threads, params.n_threads_batch = n_threads, n_threads_batch
        self._ctx = llama_cpp.llama_init_from_model(model, params)
        if not self._ctx:
            raise RuntimeError("llama.cpp could not create the batch context")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(max(n_batch, rows), 0, 1)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        self.max_rows, self.window, self.n_batch = rows, window, n_batch
        self.eos_ids = tuple(eos_ids)
        self.rows: dict[int, Row] = {}
        self.slots = [Slot(seq) for seq in range(rows)]
        self._uses = 0
        self.times = StepTimes()

    # --- rows -------------------------------------------------------------------------
    def has_room(self) -> bool:
        return len(self.rows) < self.max_rows

    def add(self, key: int, prompt: list[int], params: SamplingParams) -> Row:
        """A new row for ``prompt``, on the free slot that holds most of it (see the module docstring)."""
        slot, reuse = self._slot_for(prompt)
        if reuse < len(slot.tokens) and not llama_cpp.llama_memory_seq_rm(self._memory, slot.seq, reuse, -1):
            llama_cpp.llama_memory_seq_rm(self._memory, slot.seq, -1, -1)  # a recurrent model keeps all or none
            reuse = 0
        del slot.tokens[reuse:]
        slot.exact = reuse
        self._uses += 1
        slot.last_used = self._uses
        row = Row(key, slot, params, list(prompt[reuse:]), RowSampler(params, self.n_vocab, self.eos_ids), reuse)
        self.rows[key] = row
        return row

    def _slot_for(self, prompt: list[int]) -> tuple[Slot, int]:
        """The free slot to reuse most of ``prompt`` from (ties: the lowest sequence), and how much."""
        busy = {row.slot.seq for row in self.rows.values()}
        best, best_length = None, -1
        for slot in self.slots:
            if slot.seq not in busy:
                length = reusable(slot.tokens, slot.exact, prompt)
                if length > best_length:
                    best, best_length = slot, length
        assert best is not None, "no free slot"
        return best, best_length

    def remove(self, key: int) -> None:
        """End a row; its slot keeps its cells for the next row's prompt."""
        self.rows.pop(key, None)

    def forget(self, key: int) -> None:
        """End a row and empty its slot (its cells may not hold what its tokens say: a failed decode)."""
        row = self.rows.pop(key, None)
        if row is not None:
            llama_cpp.llama_memory_seq_rm(self._memory, row.slot.seq, -1, -1)
            row.slot.tokens.clear()
            row.slot.exact = 0

    def running(self) -> bool:
        """Some row can step (not every row waits for the server's word)."""
        return any(not row.paused for row in self.rows.values())

    # --- a step -----------------------------------------------------------------------
    def step(self) -> list[tuple[Row, int]]:
        """One decode of every running row's next token: (row, token) for each."""
        running = [row for row in self.rows.values() if not row.paused and not row.prefilling]
        if not running:
            return []
        running.sort(key=lambda row: row.slot.seq)
        return self._decode(running)

    def prefill(self) -> list[tuple[Row, int]]:
        """Decode new rows' prompt chunks, each alone, ``n_batch`` tokens in all at most: (row, first token) for
        each row whose prompt is all in."""
        budget, picked = self.n_batch, []
        for row in [r for r in self.rows.values() if r.prefilling and not r.paused]:
            take = chunk(len(row.feed), budget, self.n_batch)
            if take == 0:
                break
            budget -= take
            token = self._prefill(row, take)
            if token is not None:
                picked.append((row, token))
        return picked

    def _decode(self, rows: list[Row]) -> list[tuple[Row, int]]:
        """The running rows' next token, decoded together: each row's sampled token."""
        times = self.times
        started = time.perf_counter()
        batch = self._batch
        tokens, positions, n_seq, seq_ids, wants = batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits
        for i, row in enumerate(rows):
            token = row.feed.pop()
            tokens[i], positions[i], n_seq[i], wants[i] = token, row.pos, 1, True
            seq_ids[i][0] = row.slot.seq
            row.slot.tokens.append(token)
        batch.n_tokens = len(rows)
        decoding = time.perf_counter()
        self._run(batch)
        sampled = time.perf_counter()
        logits = self._logits(llama_cpp.llama_get_logits(self._ctx), len(rows))
        # every row plain greedy (the common case): one argmax over all rows (the first best, as llama.cpp's)
        best = logits.argmax(axis=1).tolist() if all(row.sampler.plain_greedy for row in rows) else None
        picked = []
        for i, row in enumerate(rows):
            if best is not None:
                token = best[i]
            elif row.sampler.plain_greedy:
                token = int(logits[i].argmax())
            else:
                token = row.sampler(logits[i])
            row.count += 1
            row.feed.append(int(token))
            picked.append((row, token))
        done = time.perf_counter()
        times.steps += 1
        times.rows += len(rows)
        times.build += decoding - started
        times.decode += sampled - decoding
        times.sample += done - sampled
        return picked

    def _prefill(self, row: Row, take: int) -> int | None:
        """Decode ``take`` tokens of ``row``'s prompt, alone; its first token when they end the prompt."""
        started = time.perf_counter()
        batch, seq, pos = self._batch, row.slot.seq, row.pos
        part = row.feed[:take]
        del row.feed[:take]
        last = not row.feed
        tokens, positions, n_seq, seq_ids, wants = batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits
        for i, token in enumerate(part):
            tokens[i], positions[i], n_seq[i], wants[i] = token, pos + i, 1, False
            seq_ids[i][0] = seq
        wants[take - 1] = last
        batch.n_tokens = take
        row.slot.tokens.extend(part)
        self._run(batch)
        if take >= 2:
            row.slot.exact = len(row.slot.tokens)
        self.times.prefill += time.perf_counter() - started
        if not last:
            return None
        row.prefilling = False
        logits = self._logits(llama_cpp.llama_get_logits_ith(self._ctx, take - 1), 1)[0]
        token = int(logits.argmax()) if row.sampler.plain_greedy else row.sampler(logits)
        row.count += 1
        row.feed.append(int(token))
        return token

    def _logits(self, pointer, rows: int) -> np.ndarray:
        """``rows`` rows of logits from llama.cpp's buffer at ``pointer``, not copied (valid until the next decode)."""
        address = ctypes.addressof(pointer.contents)
        return np.frombuffer((ctypes.c_float * (rows * self.n_vocab)).from_address(address), np.float32).reshape(
            rows, self.n_vocab
        )

    def _run(self, batch) -> None:
        code = llama_cpp.llama_decode(self._ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code} in a batch step")

    def close(self) -> None:
        if self._ctx:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
