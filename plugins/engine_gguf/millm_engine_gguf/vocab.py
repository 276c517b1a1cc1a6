"""Token ids to bytes through llama.cpp's vocabulary, and its end-of-generation tokens."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import llama_cpp

from millm_host.api import InvalidParameter, ModelNotLoaded, free_later

#: Ids one C call copies out of llama.cpp's buffer (about a quarter of a millisecond).
COPY_SLICE = 16384


class Vocab:
    """One model's vocabulary: each token's bytes, read once and kept.

    Its C calls may run on several threads at once (the text thread tokenizes while a
    generation decodes), as llama-server's HTTP threads tokenize beside its decode loop.
    ``retire`` waits for the calls under way before the model that owns the vocabulary is
    freed, and refuses later ones: an unload must not free it under a request's tokenizing.
    """

    def __init__(self, model: llama_cpp.llama_model_p) -> None:
        self._vocab = self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.size = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._pieces: dict[int, bytes] = {}
        self._special: dict[int, bytes] = {}
        self._calls = threading.Condition()
        self._in_use = 0
        self._retired = False

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """While the caller reads llama.cpp's vocabulary: ``retire`` waits for it to end."""
        with self._calls:
            if self._retired:
                raise ModelNotLoaded("the model was unloaded while this request read its vocabulary")
            self._in_use += 1
        try:
            yield
        finally:
            with self._calls:
                self._in_use -= 1
                if not self._in_use:
                    self._calls.notify_all()

    def retire(self) -> None:
        """Refuse new calls and wait for those under way: the vocabulary's model may then be freed."""
        with self._calls:
            self._retired = True
            self._calls.wait_for(lambda: not self._in_use)

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes ``token`` stands for; a control token is empty unless ``special``."""
        cache = self._special if special else self._pieces
        found = cache.get(token)
        if found is None:
            self.check([token])
            found = cache[token] = self._read_piece(token, special)
        return found

    def tokenize(self, data: bytes, add_special: bool) -> list[int]:
        """Ids of UTF-8 ``data``, special-token text parsed: one llama.cpp call whatever the length."""
        capacity = len(data) + 8  # a token covers at least one byte, beside the few specials added
        while True:
            buffer = (llama_cpp.llama_token * capacity)()
            with self.in_use():
                n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, capacity, add_special, True)
            if n >= 0:
                return _copied(buffer, n)
            capacity = -n  # too small: llama.cpp says how much it needs

    def check(self, ids: Sequence[int], param: str | None = None) -> None:
        """Refuse an id outside the vocabulary before llama.cpp reads past its tables."""
        for token in ids:
            if not 0 <= token < self.size:
                raise InvalidParameter(f"token id {token} is outside the vocabulary (size {self.size})", param=param)

    def _read_piece(self, token: int, special: bool) -> bytes:
        size = 32
        while True:
            buffer = ctypes.create_string_buffer(size)
            with self.in_use():
                n = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, size, 0, special)
            if n >= 0:
                return buffer.raw[:n]
            size = -n  # too small: llama.cpp says how much it needs

    def detokenize(self, ids: Sequence[int]) -> bytes:
        """The bytes of ``ids``, piece after piece, control tokens empty (no leading space is stripped)."""
        return b"".join(self.piece(token) for token in ids)

    def end_of_generation(self) -> frozenset[int]:
        """Every token llama.cpp ends a generation at (EOS, EOT, ...)."""
        return frozenset(t for t in range(self.size) if llama_cpp.llama_vocab_is_eog(self._vocab, t))

    def bos(self) -> int | None:
        """The beginning-of-sequence token, or None when the vocabulary has none."""
        token = llama_cpp.llama_vocab_bos(self._vocab)
        return None if token < 0 else token


def _copied(buffer: ctypes.Array, n: int) -> list[int]:
    """The first ``n`` ids of ``buffer`` as a list, a slice at a time, freed by the graveyard when long.

    A UGM vocabulary has no cheap bound (``token_floor``), so a 4 MiB text is tokenized
    whole: one copy of its 4 million ids held the GIL for 40-55 ms, stalling the event loop.
    """
    ids: list[int] = []
    for start in range(0, n, COPY_SLICE):
        if start:
            time.sleep(0)  # the GIL to the event loop between slices, without its waiting to be handed it
        ids += buffer[start : min(n, start + COPY_SLICE)]
    free_later(ids)
    return ids
