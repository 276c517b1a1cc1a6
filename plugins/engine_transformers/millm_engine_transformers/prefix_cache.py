"""Automatic prefix caching: prompts' keys and values kept for the next request that starts the same way.

When a prefill ends, the batch scheduler stores what its row computed over the prompt
(every layer's keys and values, and the residuals its read hooks saw) here under the
row's *key*. A later row with the same key whose prompt starts with a stored prompt's
tokens starts its prefill after them, on a copy of those keys and values.

**It never changes a result.** The key is everything besides the tokens that decides
what the prompt's positions hold: the LoRA adapter, and what each layer hook writes
there (``LayerHook.prompt_key``, e.g. a digest of the steering vector it adds). A
row with a hook that gives no key (``None``: it must see, or change, every position
itself) neither reuses nor stores. The scheduler belongs to one loaded model, so its
weights and precision are this cache's too.

**Read hooks still see every position** (probes, ``return_sae_activations``). An
entry keeps, for each read hook the storing row carried, the residual that hook saw
over the prompt (``Tap``: layer, point and ``order``). A row that reuses a prefix has
its read hooks called once on those residuals (positions 0 to the reused length),
then on its own prefill as usual: what they read is what a cold run computed, up to
floating-point rounding of the earlier batch's shapes. An entry lacking a residual a
row's reads need is not reused by that row; its own prefill then stores one that has
it.

Entries are found through chained hashes of ``BLOCK``-token blocks (as vLLM's
automatic prefix caching), then matched token by token past the last common block.
Memory is bounded (``MILLM_PREFIX_CACHE_MB``): the least recently used entries go
first. Only the scheduler's thread touches the cache.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: Tokens per hashed block: a prefix is found block by block, then extended token by token.
BLOCK = 16

#: Where a read hook sees the residual: (layer, point, order).
Tap = tuple[int, str, int]


@dataclass(eq=False)
class Stored:
    """One cached prompt: its tokens, each layer's keys and values ``[1, heads, n, d]``, its reads' residuals."""

    key: Hashable
    tokens: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    residuals: Mapping[Tap, torch.Tensor]  # tap -> [n, d_model]
    nbytes: int  # of the tensors above, measured once before they were cloned
    hashes: list[int] = field(default_factory=list)  # the chained hash after each whole block
    refs: int = 0  # index entries that lead here: none left, nothing can find it


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class Hit:
    """A stored prompt a new row reuses the first ``length`` tokens of."""

    stored: Stored
    length: int

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values over the reused tokens (views of the entry: copy before writing)."""
        n = self.length
        return [(k[:, :, :n], v[:, :, :n]) for k, v in zip(self.stored.keys, self.stored.values, strict=True)]

    def residual(self, tap: Tap) -> torch.Tensor:
        """What a read at ``tap`` saw over the reused tokens, ``[1, length, d_model]``."""
        return self.stored.residuals[tap][None, : self.length]


def chained(tokens: Sequence[int], blocks: int) -> list[int]:
    """The chained hash after each of the first ``blocks`` whole blocks of ``tokens``."""
    hashes, running = [], 0
    for index in range(blocks):
        running = hash((running, tuple(tokens[index * BLOCK : (index + 1) * BLOCK])))
        hashes.append(running)
    return hashes


class PrefixCache:
    """Stored prompts by key and leading blocks, least recently used evicted past ``capacity`` bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._lru: collections.OrderedDict[int, Stored] = collections.OrderedDict()  # id -> entry, oldest first
        self._by_block: dict[tuple[Hashable, int], Stored] = {}  # (key, chained hash) -> the newest entry
        self.hits = self.misses = 0  # lookups that reused a prefix, and those that did not
        self.hit_tokens = 0  # prompt tokens not computed again
        self.evictions = 0
        #: The most bytes a stored token has taken (keys, values and residuals), learned as prompts are stored.
        self.token_bytes = 0

    def find(self, key: Hashable, prompt: Sequence[int], taps: frozenset[Tap]) -> Hit | None:
        """The longest stored prefix of ``prompt`` under ``key`` that has the residuals ``taps`` need.

        At least one token of the prompt is left to compute (its logits start the generation).
        """
        limit = len(prompt) - 1
        best: Stored | None = None
        for index, running in enumerate(chained(prompt, limit // BLOCK)):
            entry = self._by_block.get((key, running))
            if entry is None or not taps <= entry.residuals.keys():
                break
            best, blocks = entry, index + 1
        if best is None:
            self.misses += 1
            return None
        length = blocks * BLOCK
        stop = min(limit, len(best.tokens))
        while length < stop and best.tokens[length] == prompt[length]:
            length += 1
        self._lru.move_to_end(id(best))
        self.hits += 1
        self.hit_tokens += length
        return Hit(best, length)

    def store(
        self,
        key: Hashable,
        tokens: Sequence[int],
        layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
        residuals: Mapping[Tap, torch.Tensor],
    ) -> None:
        """Keep ``tokens``' keys and values (cloned: the batch goes on writing its own) under ``key``."""
        if len(tokens) < BLOCK:  # nothing a later lookup could find
            return
        nbytes = _nbytes([*(k for k, _ in layers), *(v for _, v in layers), *residuals.values()])
        self.token_bytes = max(self.token_bytes, -(-nbytes // len(tokens)))
        if nbytes > self.capacity:  # measured before anything is cloned: a prompt too large costs no copy
            return
        entry = Stored(
            key,
            tuple(tokens),
            [k.clone() for k, _ in layers],
            [v.clone() for _, v in layers],
            {tap: residual.clone() for tap, residual in residuals.items()},
            nbytes,
            chained(tokens, len(tokens) // BLOCK),
        )
        self._lru[id(entry)] = entry
        self.used += entry.nbytes
        for running in entry.hashes:  # the newest leads: it has the residuals its own reads needed
            older = self._by_block.get((key, running))
            self._by_block[(key, running)] = entry
            entry.refs += 1
            if older is not None:
                older.refs -= 1
                if older.refs == 0:  # a longer or richer prompt took its place everywhere
                    self._remove(older)
        while self.used > self.capacity:
            self.evictions += 1
            self._remove(next(iter(self._lru.values())))

    def fits(self, length: int) -> bool:
        """Whether a prompt of ``length`` tokens would be stored, as far as the stores so far tell."""
        return length >= BLOCK and length * self.token_bytes <= self.capacity

    def _remove(self, entry: Stored) -> None:
        del self._lru[id(entry)]
        self.used -= entry.nbytes
        for running in entry.hashes:
            if self._by_block.get((entry.key, running)) is entry:
                del self._by_block[(entry.key, running)]
        entry.refs = 0

    def clear(self) -> None:
        self._lru.clear()
        self._by_block.clear()
        self.used = 0

    def stats(self) -> dict[str, Any]:
        """What ``/api/health/inference`` and ``/metrics`` report."""
        return {
            "capacity_bytes": self.capacity,
            "used_bytes": self.used,
            "entries": len(self._lru),
            "hits": self.hits,
            "misses": self.misses,
            "hit_tokens": self.hit_tokens,
            "evictions": self.evictions,
        }
